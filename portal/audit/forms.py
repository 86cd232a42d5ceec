"""The audit trail's filter and export forms: parse the query into typed values."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.db.models import Q, QuerySet

from governance.audit_export import AuditExportRange
from governance.models import AuditEvent
from records.reading import UtcDateTimeField

_BIG = 2**63 - 1


class AuditSearchForm(forms.Form):
    """Every filter is exact (an auditor asking for actor ``bob`` must not get ``bobby``), the
    time range is a half-open [from, to) in UTC like the export's."""

    actor = forms.CharField(required=False, max_length=150, help_text="A username, exactly.")
    action = forms.CharField(required=False, max_length=64, help_text="e.g. records.exported")
    object_type = forms.CharField(
        required=False, max_length=100, label="Object type", help_text="e.g. governance.apikey"
    )
    object_id = forms.CharField(required=False, max_length=64, label="Object id")
    tenant = forms.CharField(required=False, max_length=63, help_text="A tenant's slug.")
    since = UtcDateTimeField(required=False, label="From (UTC)")
    until = UtcDateTimeField(required=False, label="To (UTC)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since: datetime | None = data.get("since")
        until: datetime | None = data.get("until")
        if since is not None and until is not None and until <= since:
            self.add_error("until", "The end must be after the start.")
        return data

    def filtered(self) -> QuerySet[AuditEvent]:
        """The matching events, newest first (call after ``is_valid``)."""
        data = self.cleaned_data
        wanted = Q()
        for field, column in (
            ("actor", "actor"),
            ("action", "action"),
            ("object_type", "object_type"),
            ("object_id", "object_id"),
            ("tenant", "tenant_slug"),
        ):
            value = (data.get(field) or "").strip()
            if value:
                wanted &= Q(**{column: value})
        if data.get("since") is not None:
            wanted &= Q(occurred_at__gte=data["since"])
        if data.get("until") is not None:
            wanted &= Q(occurred_at__lt=data["until"])
        return AuditEvent.objects.filter(wanted).order_by("-sequence")

    def described(self) -> dict[str, str]:
        """The filter as asked, for the view's own audit event (valid or not)."""
        return {
            name: str(self.data.get(name, ""))[:200] for name in self.fields if self.data.get(name)
        }


class AuditExportForm(forms.Form):
    from_sequence = forms.IntegerField(
        required=False, min_value=1, max_value=_BIG, label="From event #"
    )
    to_sequence = forms.IntegerField(
        required=False, min_value=1, max_value=_BIG, label="To event #"
    )
    since = UtcDateTimeField(required=False, label="From (UTC)")
    until = UtcDateTimeField(required=False, label="To (UTC)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        kwargs.setdefault("auto_id", "export_%s")  # the filter form has since/until too
        super().__init__(*args, **kwargs)

    def wanted(self) -> AuditExportRange:
        data = self.cleaned_data
        return AuditExportRange(
            from_sequence=data.get("from_sequence"),
            to_sequence=data.get("to_sequence"),
            since=data.get("since"),
            until=data.get("until"),
        )
