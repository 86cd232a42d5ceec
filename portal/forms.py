"""The portal's forms: they parse and check what a person typed, so a mistake is shown beside
its field. The services stay the authority and check everything again."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.utils import timezone

from governance.services import USE_CASE_TRANSITIONS


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
