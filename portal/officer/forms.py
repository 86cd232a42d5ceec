"""The officer's forms: each turns what was typed into one record of the policy file.

They check only what a form must (a number is a number, JSON is JSON); every rule of the
domain is checked where the file's are (``portal.officer.plans``), and its problems come back
onto these forms' fields.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from governance.choices import (
    AtSunset,
    Capability,
    DataClassification,
    Environment,
    FileKind,
    GuardrailAction,
    GuardrailFailure,
    GuardrailSide,
    ModelStatus,
    Namespace,
    RecordPolicy,
    UseCaseKind,
)
from governance.models import Deployment, Model, ModelPrice, PriorityClass, Tenant
from governance.prices import (
    PriceError,
    amount_text,
    history_problem,
    moment_text,
    price_moment,
)
from governance.sla_windows import DAYS
from guardrails.catalogue import entries as catalogue_entries

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_concurrent")


FIELD_TEMPLATE = "portal/officer/_field.html"
# Widgets whose value is chosen, not typed: checked as they change; the rest when left.
_CHOSEN = (forms.Select, forms.SelectMultiple, forms.CheckboxInput, forms.RadioSelect)


class OfficerForm(forms.Form):
    """Labels without Django's trailing colon: the label is the field's name, read aloud.

    Every field has a place under it for its errors (``<id>_errors``) that its input names in
    ``aria-describedby`` from the start, so the errors the field-by-field check swaps in
    there are read with the field, with or without JavaScript."""

    #: False where a template lays the fields out itself (the matrix): no errors' place.
    field_by_field = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        if not self.field_by_field:
            return
        for name, field in self.fields.items():
            bound = self[name]
            if field.widget.is_hidden or not bound.auto_id:
                continue
            field.template_name = FIELD_TEMPLATE  # type: ignore[attr-defined]
            described = [f"{bound.auto_id}_helptext"] if field.help_text else []
            field.widget.attrs["aria-describedby"] = " ".join([*described, errors_id(bound)])

    def check_as_you_go(self, url: str) -> None:
        """Have each field post the form to ``url?validate=<field>`` when it changes or is
        left (htmx), and put the errors that come back in its errors' place."""
        if not self.field_by_field:
            return
        for name, field in self.fields.items():
            bound = self[name]
            if field.disabled or field.widget.is_hidden or not bound.auto_id:
                continue
            field.widget.attrs.update(
                {
                    "hx-post": f"{url}?validate={bound.html_name}",
                    "hx-trigger": "change" if isinstance(field.widget, _CHOSEN) else "blur",
                    "hx-target": f"#{errors_id(bound)}",
                    "hx-select": "unset",
                    "hx-swap": "innerHTML",
                }
            )


def errors_id(bound: forms.BoundField) -> str:
    return f"{bound.auto_id}_errors"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]


class JsonObjectField(forms.JSONField):
    """A JSON object typed in a textarea; empty (shown empty) for none."""

    def to_python(self, value: Any) -> Any:
        converted = super().to_python(value)
        if converted is not None and not isinstance(converted, dict):
            raise ValidationError("Give a JSON object, {…}, or leave it empty.")
        return converted or {}

    def prepare_value(self, value: Any) -> Any:
        return "" if value in (None, {}, "") else super().prepare_value(value)


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
    model_pins = JsonObjectField(
        label="Pinned model versions",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="The version (or alias) of a model this use case always gets, whatever the "
        'model\'s split, e.g. {"llama-3.1-8b": "stable"}. Empty: none.',
    )
    model_fallbacks = JsonObjectField(
        label="Fallback models",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="The models that serve, in order, when a model refuses a request for capacity "
        '(queue full or timed out, a 5xx, too long a prompt), e.g. {"llama-3.3-70b": '
        '["llama-3.1-8b"]}: 1 to 3 of the allowed models above. Empty: none.',
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
            "model_pins": data["model_pins"] or {},
            "model_fallbacks": data["model_fallbacks"] or {},
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
            "model_pins": dict(spec.model_pins),
            "model_fallbacks": {
                model: list(chain) for model, chain in spec.model_fallbacks.items()
            },
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
    degrade_after_seconds = forms.FloatField(
        label="Fall back after (seconds)",
        required=False,
        min_value=0.0,
        help_text="For use cases with fallback models: how long a request of this class waits "
        "on a saturated model before its fallback serves it (0: at once). Empty: only when the "
        "model refuses it. Set it on dev and batch classes so that prod keeps the large model.",
    )

    def __init__(self, *args: Any, editing: PriorityClass | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            self.fields["name"].disabled = True

    def entry(self) -> dict[str, Any]:
        entry = dict(self.cleaned_data)
        if entry["degrade_after_seconds"] is None:  # the file leaves an empty one out
            del entry["degrade_after_seconds"]
        return entry

    @staticmethod
    def initial_of(pc: PriorityClass) -> dict[str, Any]:
        return {
            "name": pc.name,
            "rank": pc.rank,
            "vllm_priority": pc.vllm_priority,
            "queue_timeout_seconds": float(pc.queue_timeout_seconds),
            "max_queue_length": pc.max_queue_length,
            "max_pool_share": float(pc.max_pool_share),
            "degrade_after_seconds": pc.degrade_after_seconds,
        }


def matrix_field_name(environment: str, namespace: str) -> str:
    return f"cell__{environment}__{namespace}"


class PriorityMatrixForm(OfficerForm):
    """Every (tenant environment, caller namespace) cell: its priority class, or none."""

    field_by_field = False  # a table of selects: its template places each cell's errors

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


# --- models and their deployments -----------------------------------------------------------
_ACTIVE: dict[str, Any] = {
    "status": ModelStatus.ACTIVE.value,
    "sunset_at": None,
    "successor": None,
    "notice_url": "",
    "at_sunset": AtSunset.REFUSE.value,
}


class ModelRecordForm(OfficerForm):
    """A model as clients name it. What the form does not show (its deployments, and what a
    later form adds) is carried over from the record as it is: see ``entry``."""

    public_id = forms.CharField(
        label="Model id",
        max_length=128,
        help_text="What clients send as model, e.g. llama-3.1-8b; it cannot change later.",
    )
    description = forms.CharField(max_length=300, required=False)
    capabilities = forms.MultipleChoiceField(
        choices=Capability.choices, required=False, widget=forms.CheckboxSelectMultiple
    )
    timeout_seconds = forms.FloatField(
        label="Timeout (seconds)",
        initial=60.0,
        help_text="For a whole request: seconds for an 8B model, minutes for one that thinks.",
    )
    max_tokens = forms.IntegerField(
        label="Most tokens per request", required=False, help_text="Empty: the model's own."
    )
    # The lifecycle (docs/models.md); the rules between these are the model's own.
    status = forms.ChoiceField(
        choices=ModelStatus.choices,
        initial=ModelStatus.ACTIVE,
        required=False,
        help_text="Deprecated: served with Deprecation and Sunset headers until the sunset.",
    )
    sunset_at = forms.DateTimeField(
        label="Sunset (UTC)",
        required=False,
        help_text="e.g. 2027-03-01 00:00; needed to deprecate.",
    )
    successor = forms.ChoiceField(
        label="Successor", required=False, help_text="The model its callers should move to."
    )
    notice_url = forms.URLField(
        label="Notice URL",
        required=False,
        assume_scheme="https",
        help_text="Linked from every answer (Link: rel=deprecation).",
    )
    at_sunset = forms.ChoiceField(
        label="At the sunset", choices=AtSunset.choices, initial=AtSunset.REFUSE, required=False
    )
    # Versions (docs/models.md): the labels are on the deployments; this says which answers.
    routing = JsonObjectField(
        label="Version routing",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Which version answers, e.g. {"split": {"v1": 95, "v2": 5}, "sticky": '
        '"request" (or "use_case"), "aliases": {"stable": "v1"}}. The versions are the labels '
        "on its active deployments. Empty: the version deployed first answers.",
    )

    def __init__(self, *args: Any, editing: Model | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            self.fields["public_id"].disabled = True
        others = Model.objects.order_by("public_id")
        if editing is not None:
            others = others.exclude(pk=editing.pk)
        successor = self.fields["successor"]
        assert isinstance(successor, forms.ChoiceField)
        successor.choices = [
            ("", "—"),
            *((m, m) for m in others.values_list("public_id", flat=True)),
        ]

    def clean_public_id(self) -> str:
        ident: str = self.cleaned_data["public_id"]
        if self.editing is None and Model.objects.filter(public_id=ident).exists():
            # The file would take it for the existing model and change that one instead.
            raise ValidationError("Model with this Public id already exists.")
        return ident

    def entry(self, current: dict[str, Any] | None = None) -> dict[str, Any]:
        """The model's record: the fields of this form over ``current`` (the exported record,
        with its deployments), so a field this form does not know stays as it is."""
        data = self.cleaned_data
        entry = dict(current or {})
        entry.update(
            {
                "id": data["public_id"],
                "description": data["description"],
                "capabilities": sorted(data["capabilities"]),
                "timeout_seconds": data["timeout_seconds"],
            }
        )
        entry.pop("max_tokens", None)
        if data["max_tokens"] is not None:
            entry["max_tokens"] = data["max_tokens"]
        lifecycle = {
            "status": data["status"] or ModelStatus.ACTIVE.value,
            "sunset_at": moment_text(data["sunset_at"]) if data["sunset_at"] else None,
            "successor": data["successor"] or None,
            "notice_url": data["notice_url"],
            "at_sunset": data["at_sunset"] or AtSunset.REFUSE.value,
        }
        entry.pop("lifecycle", None)
        if lifecycle != _ACTIVE:  # an active model's file says nothing of it
            entry["lifecycle"] = {k: v for k, v in lifecycle.items() if v not in ("", None)}
        entry.pop("routing", None)
        if data["routing"]:
            entry["routing"] = data["routing"]
        return entry

    @staticmethod
    def initial_of(model: Model) -> dict[str, Any]:
        return {
            "public_id": model.public_id,
            "description": model.description,
            "capabilities": list(model.capabilities),
            "timeout_seconds": model.timeout_seconds,
            "max_tokens": model.max_tokens,
            "status": model.status,
            "sunset_at": model.sunset_at,
            "successor": model.successor.public_id if model.successor else "",
            "notice_url": model.notice_url,
            "at_sunset": model.at_sunset,
            "routing": dict(model.routing or {}),
        }


class DeploymentForm(OfficerForm):
    """One deployment of a model: where vLLM serves it, and how much the gateway sends it."""

    served_name = forms.CharField(
        label="Served name",
        max_length=128,
        help_text="The name vLLM serves it under (--served-model-name); it cannot change later.",
    )
    replicas = forms.CharField(
        label="Replica base URLs",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One a line, e.g. http://vllm-0.vllm:8000",
    )
    node_pool = forms.CharField(
        label="Node pool", max_length=64, required=False, help_text="e.g. h100 or h200"
    )
    version = forms.CharField(
        label="Version",
        max_length=32,
        required=False,
        help_text="The model version it serves, e.g. v2: label all of the model's active "
        "deployments, or none. The model's routing says which version answers.",
    )
    lora_adapters = forms.CharField(
        label="LoRA adapters",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Adapter names served on this base model, one a line.",
    )
    max_in_flight_per_replica = forms.IntegerField(
        label="Requests at once per replica",
        initial=64,
        help_text="What the gateway sends one replica at once.",
    )
    active = forms.BooleanField(label="Active", required=False, initial=True)

    def __init__(
        self,
        *args: Any,
        editing: Deployment | None = None,
        taken: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        self.taken = taken  # the served names the model's other deployments have
        if editing is not None:
            self.fields["served_name"].disabled = True

    def clean_served_name(self) -> str:
        name: str = self.cleaned_data["served_name"]
        if name in self.taken:
            raise ValidationError(f"This model already has a deployment served as {name!r}.")
        return name

    def entry(self) -> dict[str, Any]:
        data = self.cleaned_data
        entry: dict[str, Any] = {
            "served_name": data["served_name"],
            "replicas": [line.strip() for line in data["replicas"].splitlines() if line.strip()],
            "lora_adapters": _lines(data["lora_adapters"]),
            "max_in_flight_per_replica": data["max_in_flight_per_replica"],
            "active": data["active"],
        }
        if data["node_pool"]:
            entry["node_pool"] = data["node_pool"]
        if data["version"]:
            entry["version"] = data["version"]
        return entry

    @staticmethod
    def initial_of(deployment: Deployment) -> dict[str, Any]:
        return {
            "served_name": deployment.served_name,
            "replicas": "\n".join(deployment.replicas),
            "node_pool": deployment.node_pool,
            "version": deployment.version,
            "lora_adapters": "\n".join(deployment.lora_adapters),
            "max_in_flight_per_replica": deployment.max_in_flight_per_replica,
            "active": deployment.active,
        }


# --- SLA classes ------------------------------------------------------------------------------
def windows_text(windows: list[dict[str, Any]]) -> str:
    """Windows as the form writes them, one a line: ``mon,tue,wed 22:00-06:00``."""
    return "\n".join(f"{','.join(w['days'])} {w['start']}-{w['end']}" for w in windows)


def _days(text: str) -> list[str]:
    """``mon-fri,sun`` → the days; a range of days the scheduler does not know stays as
    written, for ``governance.sla_windows`` to name it."""
    days: list[str] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        first, dash, last = part.partition("-")
        if dash and first in DAYS and last in DAYS and DAYS.index(first) <= DAYS.index(last):
            days.extend(DAYS[DAYS.index(first) : DAYS.index(last) + 1])
        else:
            days.append(part)
    return days


class SlaClassForm(OfficerForm):
    """One SLA class of a use case; the service's rules (windows that parse, a zone that
    exists, a turnaround or windows) come back from the plan onto these fields."""

    name = forms.CharField(
        max_length=63,
        help_text="Lowercase letters, digits and hyphens, unique in the use case; it cannot "
        "change later.",
    )
    description = forms.CharField(max_length=300, required=False)
    kinds = forms.MultipleChoiceField(
        label="File kinds",
        choices=FileKind.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    priority_class = forms.ChoiceField(label="Priority class")
    turnaround_seconds = forms.IntegerField(
        label="Turnaround (seconds)",
        required=False,
        help_text="Done within this long of the upload; empty: by the end of the next window.",
    )
    windows = forms.CharField(
        label="Processing windows",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="When the work may run, one a line: days and hours, e.g. "
        "mon-fri 22:00-06:00 or sat,sun 00:00-23:59. Empty: any time.",
    )
    time_zone = forms.CharField(
        label="Time zone", max_length=64, initial="UTC", help_text="e.g. Europe/Zurich"
    )
    max_file_bytes = forms.IntegerField(label="Largest file (bytes)", initial=512 * 1024 * 1024)

    def __init__(
        self,
        *args: Any,
        editing: dict[str, Any] | None = None,
        taken: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing  # the class's exported record when editing
        self.taken = taken  # the names of the use case's other classes
        priority = self.fields["priority_class"]
        assert isinstance(priority, forms.ChoiceField)
        priority.choices = [
            (pc.name, f"{pc.name} (rank {pc.rank})")
            for pc in PriorityClass.objects.order_by("rank")
        ]
        if editing is not None:
            self.fields["name"].disabled = True

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if name in self.taken:  # the service's words (governance.sla_classes)
            raise ValidationError(f"This use case already has an SLA class called '{name}'.")
        return name

    def clean_windows(self) -> list[dict[str, Any]]:
        windows = []
        for number, line in enumerate(self.cleaned_data["windows"].splitlines(), start=1):
            if not line.strip():
                continue
            days, _, hours = line.strip().rpartition(" ")
            start, dash, end = hours.partition("-")
            if not days.strip() or not dash:
                raise ValidationError(
                    f"Line {number}: write days, then hours, e.g. mon-fri 22:00-06:00."
                )
            windows.append({"days": _days(days), "start": start.strip(), "end": end.strip()})
        return windows

    def entry(self) -> dict[str, Any]:
        data = self.cleaned_data
        entry: dict[str, Any] = {
            "name": data["name"],
            "description": data["description"],
            "kinds": list(data["kinds"]),
            "priority_class": data["priority_class"],
            "windows": data["windows"],
            "time_zone": data["time_zone"],
            "max_file_bytes": data["max_file_bytes"],
        }
        if data["turnaround_seconds"] is not None:
            entry["turnaround_seconds"] = data["turnaround_seconds"]
        return entry

    @staticmethod
    def initial_of(record: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": record["name"],
            "description": record.get("description", ""),
            "kinds": list(record["kinds"]),
            "priority_class": record["priority_class"],
            "turnaround_seconds": record.get("turnaround_seconds"),
            "windows": windows_text(list(record.get("windows", []))),
            "time_zone": record.get("time_zone", "UTC"),
            "max_file_bytes": record.get("max_file_bytes", 512 * 1024 * 1024),
        }


class ConfirmForm(OfficerForm):
    """No fields: a deletion is reviewed and applied like any other change."""


# --- model prices -----------------------------------------------------------------------------
class PriceForm(OfficerForm):
    """One price of a model's history. The amounts go to the policy file as typed, so the
    parser's words (a decimal, not negative, at most six places) come back onto them; when
    a price starts is read here, since the plan names a price by its start."""

    effective_from = forms.CharField(
        label="From",
        max_length=64,
        help_text="An ISO 8601 date and time with a time zone, e.g. 2026-07-01T00:00:00Z. "
        "Only a price not yet in force can be corrected or withdrawn later.",
    )
    input_per_mtok = forms.CharField(
        label="Input per 1M tokens",
        max_length=32,
        help_text="Per million prompt tokens, e.g. 0.20.",
    )
    output_per_mtok = forms.CharField(
        label="Output per 1M tokens",
        max_length=32,
        help_text="Per million completion tokens, e.g. 0.60.",
    )

    def __init__(self, *args: Any, editing: ModelPrice | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing is not None:
            # Its start names it: moving it is a withdrawal and a new price, each planned.
            self.fields["effective_from"].disabled = True

    def clean_effective_from(self) -> datetime:
        try:
            return price_moment(self.cleaned_data["effective_from"].strip())
        except PriceError as exc:
            raise ValidationError(f"From {exc}.") from None

    def entry(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "from": moment_text(data["effective_from"]),
            "input_per_mtok": data["input_per_mtok"].strip(),
            "output_per_mtok": data["output_per_mtok"].strip(),
        }

    @staticmethod
    def initial_of(price: ModelPrice) -> dict[str, Any]:
        return {
            "effective_from": moment_text(price.effective_from),
            "input_per_mtok": amount_text(Decimal(price.input_per_mtok)),
            "output_per_mtok": amount_text(Decimal(price.output_per_mtok)),
        }


def next_midnight(now: datetime) -> str:
    """What a new price's start defaults to: the next midnight, UTC (a start in the past
    would reprice usage already priced, and "now" is past by the time it is applied)."""
    day = now.astimezone(UTC).date() + timedelta(days=1)
    return moment_text(datetime.combine(day, time(), tzinfo=UTC))


class WithdrawPriceForm(OfficerForm):
    """Nothing to fill in: a future price is withdrawn as planned. One in force is refused
    here, in the history rule's words, since the plan would only keep it and say so."""

    def __init__(self, *args: Any, price: ModelPrice, now: datetime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.price = price
        self.now = now

    def clean(self) -> dict[str, Any]:
        problem = history_problem(
            starts=(), effective_from=self.price.effective_from, creating=False, now=self.now
        )
        if problem is not None:
            raise ValidationError(f"This price {problem}.")
        return super().clean() or {}
