"""Searching records: the filters, as one form for the portal page and the API."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.db.models import QuerySet

from governance.models import ApiKey, Tenant, UseCase
from governance.roles import AnyUser
from records.models import GuardrailFinding, InteractionRecord
from records.reading.access import (
    record_tenants_visible,
    record_use_cases_visible,
    records_visible_to,
)

RECORDS_PER_PAGE = 50


_STATUS = re.compile(r"^(?:[1-5][0-9][0-9]|[1-5]xx)$")


@dataclass(frozen=True)
class RecordFilter:
    """A search over records, as validated by ``RecordSearchForm``."""

    tenant: Tenant | None = None
    use_case: UseCase | None = None
    key: str = ""  # a key id, or the start of a key's prefix
    model: str = ""
    since: datetime | None = None
    until: datetime | None = None
    status: str = ""  # "404" or a class, "4xx"
    guardrail: str = ""
    guardrail_action: str = ""
    request_id: str = ""
    record_id: str = ""
    content: str = ""

    def describe(self) -> dict[str, Any]:
        """The filter as the audit trail records it: only what was set, as plain values."""
        values: dict[str, Any] = {
            "tenant": self.tenant.slug if self.tenant else "",
            "use_case": self.use_case.pk if self.use_case else None,
            "key": self.key,
            "model": self.model,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
            "status": self.status,
            "guardrail": self.guardrail,
            "guardrail_action": self.guardrail_action,
            "request_id": self.request_id,
            "record_id": self.record_id,
            "content": self.content,
        }
        return {name: value for name, value in values.items() if value not in ("", None)}


class UtcDateTimeField(forms.DateTimeField):
    """ISO 8601 or a browser's ``datetime-local``: naive is UTC, an offset is taken to UTC."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def to_python(self, value: Any) -> datetime | None:
        parsed: datetime | None = super().to_python(value)
        if parsed is None:
            return None
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("Enter a time that exists in UTC.") from None

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None)
        return value


class RecordSearchForm(forms.Form):
    """The records search, shared by the portal page and the API's query parameters: every
    field optional; a tenant or use case outside the person's scope is "not a valid choice",
    the same answer as one that does not exist."""

    record_id = forms.CharField(required=False, max_length=40, label="Record id")
    request_id = forms.CharField(required=False, max_length=128, label="Request id")
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.none(), required=False, to_field_name="slug", empty_label="Any"
    )
    use_case = forms.ModelChoiceField(
        queryset=UseCase.objects.none(), required=False, empty_label="Any use case"
    )
    key = forms.CharField(
        required=False, max_length=32, help_text="A key's id, or the start of its prefix."
    )
    model = forms.CharField(required=False, max_length=200)
    status = forms.CharField(
        required=False, max_length=3, help_text="Exact (429) or a class (4xx, 5xx)."
    )
    guardrail = forms.CharField(
        required=False, max_length=64, help_text="Records with a finding of this guardrail."
    )
    guardrail_action = forms.ChoiceField(
        required=False,
        label="Finding action",
        choices=[("", "Any action"), *GuardrailFinding.Action.choices],
    )
    content = forms.ChoiceField(
        required=False,
        label="Content",
        choices=[("", "Any"), *InteractionRecord.Content.choices],
    )
    since = UtcDateTimeField(required=False, label="From (UTC)", help_text="Inclusive.")
    until = UtcDateTimeField(required=False, label="To (UTC)", help_text="Exclusive.")

    def __init__(self, *args: Any, user: AnyUser, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        tenant: Any = self.fields["tenant"]
        tenant.queryset = record_tenants_visible(user)
        use_case: Any = self.fields["use_case"]
        use_case.queryset = record_use_cases_visible(user)

    def _text(self, name: str) -> str:
        value = str(self.cleaned_data.get(name) or "").strip()
        if "\x00" in value:
            raise forms.ValidationError("Enter text without NUL characters.")
        return value

    def clean_record_id(self) -> str:
        return self._text("record_id")

    def clean_request_id(self) -> str:
        return self._text("request_id")

    def clean_model(self) -> str:
        return self._text("model")

    def clean_guardrail(self) -> str:
        return self._text("guardrail")

    def clean_key(self) -> str:
        value = self._text("key")
        if value and not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise forms.ValidationError("Enter a key id or the start of a key prefix.")
        return value

    def clean_status(self) -> str:
        value = self._text("status").lower()
        if value and not _STATUS.match(value):
            raise forms.ValidationError("Enter a status code (429) or a class (4xx).")
        return value

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since is not None and until is not None and until <= since:
            self.add_error("until", "Choose a time after “From”.")
        return cleaned

    def record_filter(self) -> RecordFilter:
        data = self.cleaned_data
        return RecordFilter(
            tenant=data.get("tenant"),
            use_case=data.get("use_case"),
            key=data.get("key", ""),
            model=data.get("model", ""),
            since=data.get("since"),
            until=data.get("until"),
            status=data.get("status", ""),
            guardrail=data.get("guardrail", ""),
            guardrail_action=data.get("guardrail_action", ""),
            request_id=data.get("request_id", ""),
            record_id=data.get("record_id", ""),
            content=data.get("content", ""),
        )


def records_search(user: AnyUser, found: RecordFilter) -> QuerySet[InteractionRecord]:
    """The records a person may read that match, newest first (each filter is an indexed
    column, or a subquery on one: nothing is loaded per row)."""
    rows = records_visible_to(user)
    if found.record_id:
        rows = rows.filter(record_id=found.record_id)
    if found.request_id:
        rows = rows.filter(request_id=found.request_id)
    if found.tenant is not None:
        rows = rows.filter(tenant_id=found.tenant.pk)
    if found.use_case is not None:
        rows = rows.filter(use_case_id=found.use_case.pk)
    if found.key:
        if found.key.isdigit():
            rows = rows.filter(key_id=int(found.key))
        else:
            keys = ApiKey.objects.filter(prefix__startswith=found.key).values("pk")
            rows = rows.filter(key_id__in=keys)
    if found.model:
        rows = rows.filter(model=found.model)
    if found.status:
        if found.status.endswith("xx"):
            low = int(found.status[0]) * 100
            rows = rows.filter(status__gte=low, status__lt=low + 100)
        else:
            rows = rows.filter(status=int(found.status))
    if found.guardrail or found.guardrail_action:
        findings = GuardrailFinding.objects.exclude(record_id="")
        if found.guardrail:
            findings = findings.filter(guardrail=found.guardrail)
        if found.guardrail_action:
            findings = findings.filter(action=found.guardrail_action)
        rows = rows.filter(record_id__in=findings.values("record_id"))
    if found.content:
        rows = rows.filter(content=found.content)
    if found.since is not None:
        rows = rows.filter(occurred_at__gte=found.since)
    if found.until is not None:
        rows = rows.filter(occurred_at__lt=found.until)
    return rows.order_by("-occurred_at", "-id")


@dataclass(frozen=True)
class RecordRow:
    """One search result with what it names, looked up once per page, not per row."""

    record: InteractionRecord
    use_case: UseCase | None
    key: ApiKey | None


def record_rows(records: Sequence[InteractionRecord]) -> list[RecordRow]:
    use_case_ids = {r.use_case_id for r in records}
    key_ids = {r.key_id for r in records if r.key_id is not None}
    use_cases = UseCase.objects.select_related("tenant").in_bulk(use_case_ids)
    keys = ApiKey.objects.in_bulk(key_ids)
    return [
        RecordRow(r, use_cases.get(r.use_case_id), keys.get(r.key_id) if r.key_id else None)
        for r in records
    ]
