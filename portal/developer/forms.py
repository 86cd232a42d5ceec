"""The developer's forms: a use case request, and one playground message."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from governance.choices import DataClassification, UseCaseKind
from governance.models import Tenant
from portal.forms import PortalForm

PLAYGROUND_MAX_CHARS = 4000
PLAYGROUND_MAX_TOKENS = 512


class UseCaseRequestForm(PortalForm):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), empty_label=None)
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=63, label="Identifier", help_text="Lower-case letters, digits and dashes."
    )
    kind = forms.ChoiceField(choices=UseCaseKind.choices)
    purpose = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="What it is for, who uses it, and which models you need: the officer reads it.",
    )
    data_classification = forms.ChoiceField(
        choices=DataClassification.choices,
        initial=DataClassification.INTERNAL,
        label="Data classification",
    )
    ticket_ref = forms.CharField(
        max_length=64, required=False, label="Ticket", help_text="e.g. a ServiceNow ticket"
    )

    def __init__(self, *args: Any, tenants: QuerySet[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ModelChoiceField)
        tenant_field.queryset = tenants

    def use_case_fields(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            name: data[name]
            for name in ("name", "slug", "kind", "purpose", "data_classification", "ticket_ref")
        }


class PlaygroundForm(PortalForm):
    model = forms.ChoiceField(choices=())
    message = forms.CharField(max_length=PLAYGROUND_MAX_CHARS, strip=True)
    max_tokens = forms.IntegerField(min_value=1, max_value=PLAYGROUND_MAX_TOKENS, initial=128)

    def __init__(self, *args: Any, models: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model_field = self.fields["model"]
        assert isinstance(model_field, forms.ChoiceField)
        model_field.choices = [(m, m) for m in models]
