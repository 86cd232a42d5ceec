"""The officer's forms: each turns what was typed into one record of the policy file.

They check only what a form must (a number is a number, JSON is JSON); every rule of the
domain is checked where the file's are (``portal.officer.plans``), and its problems come back
onto these forms' fields.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from governance.choices import (
    DataClassification,
    Environment,
    GuardrailAction,
    GuardrailFailure,
    GuardrailSide,
    Namespace,
    RecordPolicy,
    UseCaseKind,
)
from governance.models import Model, PriorityClass, Tenant
from guardrails.catalogue import entries as catalogue_entries

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_concurrent")


class OfficerForm(forms.Form):
    """Labels without Django's trailing colon: the label is the field's name, read aloud."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]


class TenantForm(OfficerForm):
    slug = forms.CharField(
        label="Tenant id",
        max_length=63,
        help_text="Lowercase letters, digits and hyphens; it cannot change later.",
    )
    name = forms.CharField(max_length=200)
    business_unit = forms.CharField(max_length=200)
    application_id = forms.CharField(
        label="CMDB application id", max_length=24, help_text="e.g. APP-01234"
    )
    environment = forms.ChoiceField(choices=Environment.choices)
    owner_email = forms.CharField(label="Owner's e-mail", max_length=254)
    contacts = forms.CharField(
        label="Further contacts",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="E-mail addresses, one a line.",
    )

    def __init__(self, *args: Any, editing: Tenant | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            self.fields["slug"].disabled = True
            self.fields["slug"].initial = editing.slug

    def entry(self) -> dict[str, Any]:
        data = self.cleaned_data
        entry: dict[str, Any] = {
            "id": data["slug"],
            "name": data["name"],
            "business_unit": data["business_unit"],
            "application_id": data["application_id"],
            "environment": data["environment"],
            "owner_email": data["owner_email"],
            "contacts": _lines(data["contacts"]),
        }
        # No ``legal_hold``: the plan leaves a hold as it is; it moves only with its own
        # action and a reason, on the use case's page.
        return entry

    @staticmethod
    def initial_of(tenant: Tenant) -> dict[str, Any]:
        return {
            "slug": tenant.slug,
            "name": tenant.name,
            "business_unit": tenant.business_unit,
            "application_id": tenant.application_id,
            "environment": tenant.environment,
            "owner_email": tenant.owner_email,
            "contacts": "\n".join(tenant.contacts),
        }


class UseCaseForm(OfficerForm):
    tenant = forms.ChoiceField()
    slug = forms.CharField(
        label="Use case id",
        max_length=63,
        help_text="Lowercase letters, digits and hyphens, unique in its tenant.",
    )
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=UseCaseKind.choices)
    purpose = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=10_000)
    data_classification = forms.ChoiceField(
        choices=DataClassification.choices, initial=DataClassification.INTERNAL
    )
    namespace = forms.ChoiceField(
        choices=Namespace.choices,
        initial=Namespace.DEV,
        help_text="The callers' deployment namespace: with the tenant's environment, it sets "
        "the priority class.",
    )
    ticket_ref = forms.CharField(label="Ticket", max_length=64, required=False)
    models = forms.MultipleChoiceField(
        label="Allowed models", required=False, widget=forms.CheckboxSelectMultiple
    )
    requests_per_minute = forms.IntegerField(required=False, label="Requests per minute")
    tokens_per_minute = forms.IntegerField(required=False, label="Tokens per minute")
    tokens_per_day = forms.IntegerField(required=False, label="Tokens per day")
    max_concurrent = forms.IntegerField(required=False, label="Requests at once")
    guardrail_failure = forms.ChoiceField(
        label="When a guardrail cannot run",
        choices=GuardrailFailure.choices,
        initial=GuardrailFailure.CLOSED,
    )
    record_policy = forms.ChoiceField(
        label="Records kept", choices=RecordPolicy.choices, initial=RecordPolicy.METADATA
    )
    record_retention_days = forms.IntegerField(label="Records kept for (days)", initial=90)
    records_visible_to_developers = forms.BooleanField(
        label="Developers may read the records", required=False
    )
    submit_now = forms.BooleanField(
        label="Submit for review at once",
        required=False,
        help_text="Another officer approves it in the review queue.",
    )

    def __init__(self, *args: Any, editing: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing  # a UseCaseSpec when editing
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = [(t.slug, f"{t.slug} — {t}") for t in Tenant.objects.all()]
        models_field = self.fields["models"]
        assert isinstance(models_field, forms.MultipleChoiceField)
        models_field.choices = [
            (m.public_id, m.public_id) for m in Model.objects.order_by("public_id")
        ]
        if editing is not None:
            self.fields["tenant"].disabled = True
            self.fields["slug"].disabled = True
            del self.fields["submit_now"]  # its lifecycle has its own actions

    def entry(self, guardrails: list[dict[str, Any]]) -> dict[str, Any]:
        data = self.cleaned_data
        entry: dict[str, Any] = {
            "id": f"{data['tenant']}/{data['slug']}",
            "name": data["name"],
            "kind": data["kind"],
            "purpose": data["purpose"],
            "data_classification": data["data_classification"],
            "namespace": data["namespace"],
            "ticket_ref": data["ticket_ref"],
            "models": sorted(data["models"]),
            "limits": {n: data[n] for n in LIMIT_FIELDS if data[n] is not None},
            "guardrails": guardrails,
            "guardrail_failure": data["guardrail_failure"],
            "records": {
                "policy": data["record_policy"],
                "retention_days": data["record_retention_days"],
                "developers_can_read": data["records_visible_to_developers"],
            },
        }
        spec = self.editing
        if spec is None:
            entry["status"] = "submitted" if data.get("submit_now") else "draft"
            return entry
        # What this form does not edit stays as the database has it.
        entry["status"] = spec.status
        if spec.service_account_client_id:
            entry["service_account_client_id"] = spec.service_account_client_id
        entry["async_tasks"] = {
            "result_ttl_seconds": spec.async_tasks.result_ttl_seconds,
            "cache_seconds": spec.async_tasks.cache_seconds,
        }
        return entry  # without ``legal_hold``: a hold stays as it is (see TenantForm.entry)

    @staticmethod
    def initial_of(spec: Any) -> dict[str, Any]:
        return {
            "tenant": spec.tenant,
            "slug": spec.slug,
            "name": spec.name,
            "kind": spec.kind,
            "purpose": spec.purpose,
            "data_classification": spec.data_classification,
            "namespace": spec.namespace,
            "ticket_ref": spec.ticket_ref,
            "models": list(spec.models),
            **{n: getattr(spec.limits, n) for n in LIMIT_FIELDS},
            "guardrail_failure": spec.guardrail_failure,
            "record_policy": spec.records.policy,
            "record_retention_days": spec.records.retention_days,
            "records_visible_to_developers": spec.records.developers_can_read,
        }


def _guardrail_choices() -> list[tuple[str, str]]:
    return [("", "— none —")] + [
        (name, f"{entry.label} ({name})") for name, entry in sorted(catalogue_entries().items())
    ]


class GuardrailForm(OfficerForm):
    """One guardrail selection; a row with no guardrail chosen selects nothing."""

    guardrail = forms.ChoiceField(required=False)
    side = forms.ChoiceField(choices=GuardrailSide.choices, initial=GuardrailSide.REQUEST)
    action = forms.ChoiceField(choices=GuardrailAction.choices, initial=GuardrailAction.BLOCK)
    config = forms.CharField(
        label="Settings (JSON)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text='e.g. {"entities": ["EMAIL"]}; empty: the guardrail\'s defaults.',
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        guardrail = self.fields["guardrail"]
        assert isinstance(guardrail, forms.ChoiceField)
        guardrail.choices = _guardrail_choices()

    def clean_config(self) -> dict[str, Any]:
        text = self.cleaned_data["config"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"Not JSON: {exc}.") from None
        if not isinstance(value, dict):
            raise ValidationError("Give a JSON object, in braces.")
        return value

    def selection(self) -> dict[str, Any] | None:
        data = self.cleaned_data
        if not data.get("guardrail"):
            return None
        selection = {"guardrail": data["guardrail"], "side": data["side"], "action": data["action"]}
        if data["config"]:
            selection["config"] = data["config"]
        return selection


GuardrailFormSet = forms.formset_factory(GuardrailForm, extra=1, max_num=20)


def guardrail_initial(spec: Any) -> list[dict[str, Any]]:
    return [
        {
            "guardrail": g.guardrail,
            "side": g.side,
            "action": g.action,
            "config": json.dumps(g.config, sort_keys=True) if g.config else "",
        }
        for g in sorted(spec.guardrails, key=lambda g: g.position)
    ]


class PriorityClassForm(OfficerForm):
    name = forms.CharField(max_length=32, help_text="Lowercase letters, digits and hyphens.")
    rank = forms.IntegerField(
        help_text="0 is served first; larger numbers wait behind smaller ones. Each rank is unique."
    )
    vllm_priority = forms.IntegerField(
        label="vLLM priority", help_text="Passed to vLLM's scheduler, which serves lowest first."
    )
    queue_timeout_seconds = forms.FloatField(label="Queue timeout (seconds)")
    max_queue_length = forms.IntegerField(label="Longest queue")
    max_pool_share = forms.FloatField(
        label="Largest share of a model's slots", help_text="Between 0 and 1; 1: all of them."
    )

    def __init__(self, *args: Any, editing: PriorityClass | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            self.fields["name"].disabled = True

    def entry(self) -> dict[str, Any]:
        return dict(self.cleaned_data)

    @staticmethod
    def initial_of(pc: PriorityClass) -> dict[str, Any]:
        return {
            "name": pc.name,
            "rank": pc.rank,
            "vllm_priority": pc.vllm_priority,
            "queue_timeout_seconds": float(pc.queue_timeout_seconds),
            "max_queue_length": pc.max_queue_length,
            "max_pool_share": float(pc.max_pool_share),
        }


def matrix_field_name(environment: str, namespace: str) -> str:
    return f"cell__{environment}__{namespace}"


class PriorityMatrixForm(OfficerForm):
    """Every (tenant environment, caller namespace) cell: its priority class, or none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        classes = [("", "— none —")] + [
            (pc.name, pc.name) for pc in PriorityClass.objects.order_by("-rank")
        ]
        self.cells: list[tuple[str, list[str]]] = []
        for environment, env_label in Environment.choices:
            names = []
            for namespace, ns_label in Namespace.choices:
                name = matrix_field_name(environment, namespace)
                self.fields[name] = forms.ChoiceField(
                    label=f"{env_label} tenants, {ns_label} namespace",
                    choices=classes,
                    required=False,
                )
                names.append(name)
            self.cells.append((environment, names))

    def rows(self) -> list[tuple[str, list[forms.BoundField]]]:
        labels = dict(Environment.choices)
        return [(labels[env], [self[name] for name in names]) for env, names in self.cells]

    @staticmethod
    def namespaces() -> list[str]:
        return [str(label) for _value, label in Namespace.choices]

    def matrix(self) -> dict[str, dict[str, str]]:
        matrix: dict[str, dict[str, str]] = {}
        for environment, _label in Environment.choices:
            for namespace, _ns in Namespace.choices:
                chosen = self.cleaned_data.get(matrix_field_name(environment, namespace))
                if chosen:
                    matrix.setdefault(environment, {})[namespace] = chosen
        return matrix

    @staticmethod
    def initial_of(matrix: dict[str, dict[str, str]]) -> dict[str, str]:
        return {
            matrix_field_name(environment, namespace): name
            for environment, row in matrix.items()
            for namespace, name in row.items()
        }
