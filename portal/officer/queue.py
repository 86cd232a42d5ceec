"""What an officer needs beside each request in the review queue: its history.

The history of a request is the audit trail of its object and, for a key, of the use case it
is for: who asked, who changed what, and what was decided before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db.models import Model as DjangoModel
from django.db.models import Q

from governance.models import ApiKey, AuditEvent, UseCase

HISTORY_LENGTH = 20  # the newest events of each object; the audit page has the rest


def _ref(obj: DjangoModel) -> tuple[str, str]:
    return obj._meta.label_lower, str(obj.pk)


def histories(objects: Iterable[DjangoModel]) -> dict[tuple[str, str], list[AuditEvent]]:
    """The newest audit events of each object, oldest first, keyed by (type, id)."""
    refs = {_ref(obj) for obj in objects}
    if not refs:
        return {}
    wanted = Q()
    for object_type, object_id in refs:
        wanted |= Q(object_type=object_type, object_id=object_id)
    found: dict[tuple[str, str], list[AuditEvent]] = defaultdict(list)
    for event in AuditEvent.objects.filter(wanted).order_by("-sequence")[: 200 * len(refs)]:
        bucket = found[(event.object_type, event.object_id)]
        if len(bucket) < HISTORY_LENGTH:
            bucket.append(event)
    return {ref: list(reversed(events)) for ref, events in found.items()}


def attach_histories(keys: list[ApiKey], use_cases: list[UseCase]) -> None:
    """Give each queued key and use case a ``history`` (and keys their use case's too)."""
    found = histories([*keys, *use_cases, *(key.use_case for key in keys)])
    for key in keys:
        key.history = found.get(_ref(key), [])  # type: ignore[attr-defined]
        key.use_case_history = found.get(_ref(key.use_case), [])  # type: ignore[attr-defined]
    for use_case in use_cases:
        use_case.history = found.get(_ref(use_case), [])  # type: ignore[attr-defined]
