"""The portal's forms: they parse and check what a person typed, so a mistake is shown beside
its field. The services stay the authority and check everything again."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from governance.choices import RecordPolicy
from governance.models import UseCase
from governance.services.record_bounds import RETENTION_DAYS_MAX
from governance.services.use_cases import USE_CASE_TRANSITIONS
from records.models import AdmissionDecision, GuardrailFinding


class PortalForm(forms.Form):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")  # labels read as names, without a colon
        super().__init__(*args, **kwargs)


class KeyRequestForm(PortalForm):
    name = forms.CharField(
        max_length=200,
        help_text="Something your team will recognise, e.g. “checkout-service prod”.",
    )
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What will call the gateway with this key, and why. The officer reads this.",
    )
    expires_on = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        label="Expires on (optional)",
        help_text="The key stops working at the end of this day. Leave empty for no expiry.",
    )

    def clean_expires_on(self) -> date | None:
        day: date | None = self.cleaned_data.get("expires_on")
        if day is None:
            return None
        today = timezone.localdate()
        if day <= today:
            raise forms.ValidationError("Choose a day after today.")
        longest = settings.API_KEY_MAX_LIFETIME_DAYS
        if day > today + timedelta(days=longest - 1):
            raise forms.ValidationError(f"Keys live at most {longest} days.")
        return day

    @property
    def expires_at(self) -> datetime | None:
        day: date | None = self.cleaned_data.get("expires_on")
        if day is None:
            return None
        return timezone.make_aware(datetime.combine(day, time(23, 59, 59)))


class ReasonForm(PortalForm):
    """An optional reason; the service says when one is required (e.g. to reject)."""

    reason = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )


class KeyDecisionForm(ReasonForm):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])

    @property
    def approve(self) -> bool:
        return bool(self.cleaned_data["decision"] == "approve")


class UseCaseTransitionForm(ReasonForm):
    transition = forms.ChoiceField(choices=[(name, name) for name in USE_CASE_TRANSITIONS])


class RecordSettingsForm(PortalForm):
    """What the gateway keeps of a use case's requests, how long, and who reads it."""

    record_policy = forms.ChoiceField(
        choices=RecordPolicy.choices,
        label="Record",
        help_text="Full keeps the request and the response (after redaction); metadata keeps "
        "who, when, model, tokens and status; none keeps nothing.",
    )
    record_retention_days = forms.IntegerField(
        min_value=1,
        max_value=RETENTION_DAYS_MAX,
        label="Keep records for (days)",
        help_text="A shorter period applies at the next retention run; a legal hold keeps "
        "records whatever this says.",
    )
    records_visible_to_developers = forms.BooleanField(
        required=False,
        label="The tenant's developers may read these records",
    )


class LegalHoldForm(PortalForm):
    """Place or lift a legal hold, on the use case or on its whole tenant, with a reason."""

    target = forms.ChoiceField(choices=[("use_case", "use case"), ("tenant", "tenant")])
    hold = forms.TypedChoiceField(
        choices=[("place", "Place"), ("lift", "Lift")], coerce=lambda value: value == "place"
    )
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class UTCDateTimeField(forms.DateTimeField):
    """A ``datetime-local`` input read as UTC, whatever ``SWITCHYARD_TIME_ZONE`` says."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def to_python(self, value: Any) -> datetime | None:
        with timezone.override(UTC):
            result: datetime | None = super().to_python(value)
        return result


class DecisionSearchForm(PortalForm):
    """The admission-decisions page's search (a GET form: every field optional)."""

    request_id = forms.CharField(
        required=False,
        max_length=128,
        label="Request id",
        help_text="Exact, as in the response's x-request-id header.",
    )
    use_case = forms.ModelChoiceField(
        queryset=UseCase.objects.none(), required=False, empty_label="Any use case"
    )
    decision = forms.ChoiceField(
        required=False,
        choices=[
            ("", "Any decision"),
            (AdmissionDecision.Kind.REJECTED, "Rejected"),
            (AdmissionDecision.Kind.SHED, "Shed"),
            (AdmissionDecision.Kind.QUEUED, "Queued"),
        ],
    )
    occurred_from = UTCDateTimeField(
        required=False, label="From (UTC)", help_text="Inclusive, in UTC."
    )
    occurred_to = UTCDateTimeField(required=False, label="To (UTC)", help_text="Exclusive, in UTC.")

    def __init__(self, *args: Any, use_cases: QuerySet[UseCase], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field: Any = self.fields["use_case"]
        field.queryset = use_cases.order_by("tenant__slug", "slug")

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        start, end = cleaned.get("occurred_from"), cleaned.get("occurred_to")
        if start is not None and end is not None and end <= start:
            self.add_error("occurred_to", "Choose a time after “From”.")
        return cleaned


class FindingSearchForm(DecisionSearchForm):
    """The guardrail-findings page's search (a GET form: every field optional)."""

    decision = None  # type: ignore[assignment]
    guardrail = forms.CharField(
        required=False, max_length=64, help_text="A catalogue name, e.g. pii or prompt_injection."
    )
    action = forms.ChoiceField(
        required=False,
        choices=[("", "Any action"), *GuardrailFinding.Action.choices],
    )

    field_order = ("request_id", "use_case", "guardrail", "action", "occurred_from", "occurred_to")
