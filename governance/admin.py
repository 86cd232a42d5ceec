"""Governance records in the Django admin, for platform admins.

Every write — a form, an inline row, a deletion, an action — goes through the services, so it
is role-checked, audited and republishes the gateway's policy snapshot, as on every other
door. Lifecycle moves (use case approval, key decisions) are admin actions that go through
the same services as the portal and the API; their status fields are read-only here.
"""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model as DjangoModel
from django.db.models import QuerySet, URLField
from django.forms import ModelForm
from django.http import HttpRequest

from governance.audit import Actor
from governance.choices import SLA_CLASS_FIELDS
from governance.errors import Conflict
from governance.guardrail_selections import catalogue_items, selection_validate
from governance.models import (
    ApiKey,
    AuditEvent,
    Deployment,
    FileRegistration,
    GuardrailSelection,
    Model,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    S3Credential,
    SlaClass,
    Tenant,
    UseCase,
)
from governance.services.api_keys import api_key_decide, api_key_revoke
from governance.services.generic_records import record_create, record_delete, record_update
from governance.services.model_fallbacks import outside_models
from governance.services.record_policy import tenant_set_legal_hold, use_case_set_legal_hold
from governance.services.use_cases import use_case_transition
from governance.sla_classes import (
    sla_class_create,
    sla_class_delete,
    sla_class_update,
    sla_class_validate,
)
from governance.webhook_urls import validate_webhook_url


def _m2m_of(form: ModelForm[Any]) -> dict[str, Any]:
    opts = form.instance._meta
    return {
        f.name: form.cleaned_data[f.name] for f in opts.many_to_many if f.name in form.cleaned_data
    }


def _save_through_services(request: HttpRequest, form: ModelForm[Any], change: bool) -> None:
    """Save the form's row (and its many-to-many fields) with the record services."""
    actor = Actor.from_request(request)
    if change:
        record_update(actor=actor, instance=form.instance, changes={}, m2m=_m2m_of(form))
    else:
        record_create(actor=actor, instance=form.instance, m2m=_m2m_of(form))


class AuditedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin whose every write is a service call (the admin's own saves are skipped).

    The admin runs the whole request in one transaction, so a refusal (a 403 for someone
    without an officer's or admin's role) leaves nothing half-written.
    """

    def save_model(
        self, request: HttpRequest, obj: Any, form: ModelForm[Any], change: bool
    ) -> None:
        pass  # saved in save_related, with its many-to-many fields, by the services

    def save_related(
        self, request: HttpRequest, form: ModelForm[Any], formsets: Any, change: bool
    ) -> None:
        _save_through_services(request, form, change)
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)

    def save_formset(
        self, request: HttpRequest, form: ModelForm[Any], formset: Any, change: bool
    ) -> None:
        """Inline rows (a use case's guardrails) are records too: each through the services."""
        actor = Actor.from_request(request)
        formset.save(commit=False)
        for obj in formset.deleted_objects:
            record_delete(actor=actor, instance=obj)
        for obj in formset.new_objects:
            record_create(actor=actor, instance=obj)
        for obj, _fields in formset.changed_objects:
            record_update(actor=actor, instance=obj, changes={})

    def delete_model(self, request: HttpRequest, obj: DjangoModel) -> None:
        record_delete(actor=Actor.from_request(request), instance=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


def _run_service(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any], call: Any
) -> None:
    done = 0
    for obj in queryset:
        try:
            call(obj)
            done += 1
        except (Conflict, ValidationError, PermissionDenied) as exc:
            modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{done} done.", messages.SUCCESS)


class GuardrailSelectionForm(forms.ModelForm):  # type: ignore[type-arg]
    """A selection's row, checked against the catalogue as the services check it, so that a
    bad setting is an error beside its field rather than a failed save."""

    guardrail = forms.ChoiceField()
    position = forms.IntegerField(
        min_value=0, required=False, help_text="Order they run in; empty: after the others"
    )

    class Meta:
        model = GuardrailSelection
        fields = ("guardrail", "side", "action", "config", "position")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(item.name, f"{item.label} ({item.name})") for item in catalogue_items()]
        field = self.fields["guardrail"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices

    def clean_position(self) -> int:
        position = self.cleaned_data.get("position")
        if position is None:  # after the others
            use_case_id = self.instance.use_case_id
            return GuardrailSelection.objects.filter(use_case_id=use_case_id).count()
        return int(position)

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        use_case_id = self.instance.use_case_id
        if self.errors or use_case_id is None or data.get("DELETE"):
            return data
        data["config"] = selection_validate(
            use_case=UseCase.objects.get(pk=use_case_id),
            guardrail=data.get("guardrail", ""),
            side=data.get("side", ""),
            action=data.get("action", ""),
            config=data.get("config"),
            exclude_pk=self.instance.pk,
        )
        return data


class GuardrailInline(admin.TabularInline):  # type: ignore[type-arg]
    """A use case's guardrails, in the order they run."""

    model = GuardrailSelection
    form = GuardrailSelectionForm
    extra = 0
    ordering = ("position", "pk")


class LegalHoldForm(forms.ModelForm):  # type: ignore[type-arg]
    """A tenant's or use case's form with its legal hold: ticking or clearing the box needs a
    reason, which the legal-hold service records in the audit trail."""

    legal_hold_reason = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required when you place or lift the legal hold; kept in the audit trail",
    )

    def hold_changed(self) -> bool:
        stored = bool(
            self.instance.pk
            and type(self.instance)
            ._default_manager.filter(pk=self.instance.pk, legal_hold=True)
            .exists()
        )
        return bool(self.cleaned_data.get("legal_hold")) != stored

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if (
            "legal_hold" in data
            and self.hold_changed()
            and not data.get("legal_hold_reason", "").strip()
        ):
            verb = "placing" if data["legal_hold"] else "lifting"
            self.add_error("legal_hold_reason", f"Say why you are {verb} the legal hold.")
        return data


class LegalHoldAdmin(AuditedAdmin):
    """Saves the record through the record services and moves its hold through the
    legal-hold service (the record services refuse to move a hold)."""

    form = LegalHoldForm

    def save_related(
        self, request: HttpRequest, form: ModelForm[Any], formsets: Any, change: bool
    ) -> None:
        assert isinstance(form, LegalHoldForm)
        moved = form.hold_changed()
        wanted = bool(form.cleaned_data.get("legal_hold"))
        if moved:
            form.instance.legal_hold = not wanted  # as stored: the service moves it below
        super().save_related(request, form, formsets, change)
        if moved:
            self.set_hold(
                Actor.from_request(request),
                form.instance,
                wanted,
                form.cleaned_data["legal_hold_reason"],
            )

    def set_hold(self, actor: Actor, obj: Any, hold: bool, reason: str) -> None:
        raise NotImplementedError


@admin.register(Tenant)
class TenantAdmin(LegalHoldAdmin):
    list_display = (
        "slug",
        "name",
        "business_unit",
        "application_id",
        "environment",
        "owner_email",
        "legal_hold",
    )
    list_filter = ("environment",)
    search_fields = ("slug", "name", "application_id", "business_unit")
    filter_horizontal = ("members",)

    def set_hold(self, actor: Actor, obj: Any, hold: bool, reason: str) -> None:
        tenant_set_legal_hold(actor=actor, tenant=obj, hold=hold, reason=reason)


def _none_is_empty(form: ModelForm[Any], name: str) -> Any:
    """An emptied JSON object field is an empty object ({}), not a null the column refuses."""
    value = form.cleaned_data.get(name)
    return {} if value is None else value


class ModelRecordForm(forms.ModelForm):  # type: ignore[type-arg]
    """A model's form; its routing (governance/model_routing.py) is checked by the model."""

    def clean_routing(self) -> Any:
        return _none_is_empty(self, "routing")


@admin.register(Model)
class ModelAdmin(AuditedAdmin):
    form = ModelRecordForm
    list_display = ("public_id", "capabilities", "status", "sunset_at", "successor")
    list_filter = ("status",)
    search_fields = ("public_id",)
    readonly_fields = ("deprecated_at",)
    autocomplete_fields = ("successor",)


@admin.register(Deployment)
class DeploymentAdmin(AuditedAdmin):
    list_display = (
        "model",
        "served_name",
        "version",
        "node_pool",
        "max_in_flight_per_replica",
        "active",
    )
    list_filter = ("active", "node_pool", "version")


class UseCaseForm(LegalHoldForm):
    """A use case's form; its pins (``model_pins``) and fallbacks (``model_fallbacks``) are
    checked by the use case."""

    def clean_model_pins(self) -> Any:
        return _none_is_empty(self, "model_pins")

    def clean_model_fallbacks(self) -> Any:
        return _none_is_empty(self, "model_fallbacks")

    def clean(self) -> dict[str, Any]:
        """The chains against the models this form gives the use case (not the stored ones:
        both may change in one save)."""
        cleaned: dict[str, Any] = super().clean() or {}
        chains, models = cleaned.get("model_fallbacks"), cleaned.get("allowed_models")
        if chains and models is not None:
            problem = outside_models(chains, {model.public_id for model in models})
            if problem is not None:
                self.add_error("model_fallbacks", problem)
        return cleaned


@admin.register(UseCase)
class UseCaseAdmin(LegalHoldAdmin):
    form = UseCaseForm
    # Webhook URLs typed without a scheme are https (Django 6's default, asked for now), and
    # never an internal address (the rule the webhook API applies).
    formfield_overrides = {
        URLField: {"assume_scheme": "https", "validators": [validate_webhook_url]}
    }
    list_display = (
        "slug",
        "tenant",
        "kind",
        "status",
        "namespace",
        "data_classification",
        "service_account_client_id",
        "record_policy",
        "legal_hold",
    )
    list_filter = (
        "status",
        "kind",
        "namespace",
        "data_classification",
        "record_policy",
        "legal_hold",
    )
    search_fields = ("slug", "name", "tenant__slug", "ticket_ref", "service_account_client_id")
    filter_horizontal = ("allowed_models",)
    readonly_fields = ("status", "status_changed_at", "status_changed_by", "status_reason")
    inlines = (GuardrailInline,)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A use case never moves to another tenant (the API refuses it too).
        fixed = ("tenant",) if obj is not None else ()
        return (*super().get_readonly_fields(request, obj), *fixed)

    actions = ("approve", "suspend", "reinstate", "retire")

    def set_hold(self, actor: Actor, obj: Any, hold: bool, reason: str) -> None:
        use_case_set_legal_hold(actor=actor, use_case=obj, hold=hold, reason=reason)

    def _transition(
        self, request: HttpRequest, queryset: QuerySet[UseCase], transition: str
    ) -> None:
        actor = Actor.from_request(request)
        _run_service(
            self,
            request,
            queryset,
            lambda uc: use_case_transition(
                actor=actor,
                use_case=uc,
                transition=transition,
                reason=f"{transition} from the admin by {actor.username}",
            ),
        )

    @admin.action(description="Approve selected submitted use cases")
    def approve(self, request: HttpRequest, queryset: QuerySet[UseCase]) -> None:
        self._transition(request, queryset, "approve")

    @admin.action(description="Suspend selected use cases (their keys stop at once)")
    def suspend(self, request: HttpRequest, queryset: QuerySet[UseCase]) -> None:
        self._transition(request, queryset, "suspend")

    @admin.action(description="Reinstate selected suspended use cases")
    def reinstate(self, request: HttpRequest, queryset: QuerySet[UseCase]) -> None:
        self._transition(request, queryset, "reinstate")

    @admin.action(description="Retire selected use cases")
    def retire(self, request: HttpRequest, queryset: QuerySet[UseCase]) -> None:
        self._transition(request, queryset, "retire")


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = (
        "name",
        "rank",
        "vllm_priority",
        "queue_timeout_seconds",
        "max_queue_length",
        "max_pool_share",
        "degrade_after_seconds",
    )


@admin.register(PriorityRule)
class PriorityRuleAdmin(AuditedAdmin):
    list_display = ("environment", "namespace", "priority_class")
    list_filter = ("environment", "namespace", "priority_class")


@admin.register(RateLimitPolicy)
class RateLimitPolicyAdmin(AuditedAdmin):
    list_display = (
        "name",
        "scope",
        "model",
        "tenant",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
    )
    list_filter = ("scope",)


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin):
    list_display = (
        "prefix",
        "name",
        "use_case",
        "status",
        "requested_by",
        "expires_at",
        "last_used_at",
    )
    list_filter = ("status",)
    search_fields = ("prefix", "name", "use_case__slug")
    readonly_fields = (
        "use_case",  # a key never moves to another use case, let alone another tenant
        "status",
        "prefix",
        "requested_by",
        "decided_by",
        "decided_at",
        "decision_reason",
        "revealed_at",
        "last_used_at",
        "rotated_from",
        "created_at",
    )
    actions = ("approve", "revoke")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are requested in the portal or the API, never typed in

    @admin.action(description="Approve selected pending key requests")
    def approve(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        actor = Actor.from_request(request)
        _run_service(
            self, request, queryset, lambda key: api_key_decide(actor=actor, key=key, approve=True)
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        actor = Actor.from_request(request)
        _run_service(
            self,
            request,
            queryset,
            lambda key: api_key_revoke(actor=actor, key=key, reason="revoked from the admin"),
        )


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "sequence",
        "occurred_at",
        "actor",
        "action",
        "object_type",
        "object_repr",
        "tenant_slug",
    )
    list_filter = ("action", "object_type")
    search_fields = ("actor", "object_repr", "request_id", "tenant_slug")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SlaClassForm(forms.ModelForm):  # type: ignore[type-arg]
    """Shows the SLA-class rules' messages on the fields they concern, as the API does."""

    class Meta:
        model = SlaClass
        fields = ("use_case", *SLA_CLASS_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if self.errors:
            return cleaned
        candidate = SlaClass(pk=self.instance.pk, **cleaned)
        try:
            sla_class_validate(candidate)
        except ValidationError as exc:
            for field, problems in exc.message_dict.items():
                for problem in problems:
                    self.add_error(field if field in self.fields else None, problem)
        return cleaned


@admin.register(SlaClass)
class SlaClassAdmin(AuditedAdmin):
    form = SlaClassForm
    list_display = ("name", "use_case", "turnaround_seconds", "priority_class", "time_zone")
    list_filter = ("priority_class",)
    search_fields = ("name", "use_case__slug", "use_case__tenant__slug")

    def save_related(
        self, request: HttpRequest, form: ModelForm[Any], formsets: Any, change: bool
    ) -> None:
        actor = Actor.from_request(request)
        sla_class: SlaClass = form.instance
        if change:
            changes = {name: form.cleaned_data[name] for name in form.changed_data}
            sla_class_update(actor=actor, sla_class=sla_class, changes=changes)
        else:
            fields = {
                name: form.cleaned_data[name]
                for name in SlaClassForm.Meta.fields
                if name not in ("use_case", "name", "priority_class")
            }
            form.instance = sla_class_create(
                actor=actor,
                use_case=sla_class.use_case,
                name=sla_class.name,
                priority_class=sla_class.priority_class,
                **fields,
            )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A class that registrations use stays (the service refuses it too); hiding the
        # button says so before the click rather than after.
        if isinstance(obj, SlaClass) and obj.files.exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: DjangoModel) -> None:
        sla_class_delete(actor=Actor.from_request(request), sla_class=cast(SlaClass, obj))


@admin.register(FileRegistration)
class FileRegistrationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: a registration moves only through its state machine (scheduler/files/states)."""

    list_display = ("filename", "use_case", "kind", "state", "progress", "promised_by")
    list_filter = ("state", "kind")
    search_fields = ("filename", "use_case__slug", "registered_by")
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in FileRegistration._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(S3Credential)
class S3CredentialAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: credentials are issued, rotated and revoked through the API (audited), and
    the sealed secret is never shown."""

    list_display = ("access_key_id", "use_case", "name", "status", "created_at", "last_used_at")
    list_filter = ("status",)
    search_fields = ("access_key_id", "name", "use_case__slug")
    exclude = ("secret_sealed",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
