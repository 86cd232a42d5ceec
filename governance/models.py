"""Governance records. Rules that span rows live in services/; models guard one row."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from gateway.discovery import ServiceName, is_service_name
from governance import model_routing
from governance.choices import (
    ApiKeyStatus,
    AtSunset,
    Capability,
    DataClassification,
    Environment,
    FileKind,
    FileState,
    GuardrailAction,
    GuardrailFailure,
    GuardrailSide,
    ModelStatus,
    Namespace,
    RateLimitScope,
    RecordPolicy,
    UseCaseKind,
    UseCaseStatus,
)

#: the most fallback models one model of a use case may have
MAX_FALLBACKS = 3

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$", "Use lowercase letters, digits and hyphens (max 63)."
)
model_id_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
    "Use letters, digits and . _ : / - (max 128), starting with a letter or digit.",
)
application_id_validator = RegexValidator(
    r"^[A-Z][A-Z0-9]{1,9}-[0-9]{1,10}$", "Use the CMDB form, e.g. APP-1234."
)
guardrail_name_validator = RegexValidator(
    r"^[a-z][a-z0-9_]{0,63}$", "Use a catalogue name: lowercase letters, digits and _."
)
client_id_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$",
    "Use the Keycloak client id: letters, digits and . _ : / @ - (max 255), "
    "starting with a letter or digit.",
)
# One client acts as one use case: its tokens must resolve to exactly one principal.
SERVICE_ACCOUNT_TAKEN = (
    "Another use case is already bound to this Keycloak client; a client acts as one use "
    "case only (unbind it there first)."
)


def _validate_string_list(value: Any, field: str, *, allowed: set[str] | None = None) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValidationError({field: "Give a list of non-empty strings."})
    if len(set(value)) != len(value):
        raise ValidationError({field: "Remove the duplicates."})
    if allowed is not None:
        unknown = [item for item in value if item not in allowed]
        if unknown:
            raise ValidationError({field: f"Unknown value {unknown[0]!r}; use {sorted(allowed)}."})


class Tenant(models.Model):
    """A business unit's application in one environment (dev, test, UAT or prod)."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    business_unit = models.CharField(max_length=200)
    application_id = models.CharField(
        max_length=24, validators=[application_id_validator], help_text="CMDB application id"
    )
    environment = models.CharField(max_length=8, choices=Environment.choices)
    owner_email = models.EmailField()
    contacts = models.JSONField(default=list, blank=True, help_text="Further contact e-mails")
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="tenants",
        help_text="People who may see and work on this tenant's records",
    )
    legal_hold = models.BooleanField(
        default=False,
        help_text="Suspends the deletion of every use case's interaction records "
        "(retention) while set",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name} ({self.environment})"

    def clean(self) -> None:
        _validate_string_list(self.contacts, "contacts")
        from django.core.validators import validate_email

        for email in self.contacts:
            try:
                validate_email(email)
            except ValidationError:
                raise ValidationError(
                    {"contacts": f"{email!r} is not an e-mail address."}
                ) from None


class Model(models.Model):
    """A model as clients name it: the public id in ``model`` of an OpenAI request."""

    public_id = models.CharField(max_length=128, unique=True, validators=[model_id_validator])
    description = models.CharField(max_length=300, blank=True)
    capabilities = models.JSONField(default=list, help_text="chat, completions, embeddings, …")
    timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Seconds for a whole request: seconds for an 8B model, minutes if it thinks",
    )
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The lifecycle (docs/models.md): active → deprecated (notices until the sunset) → retired.
    status = models.CharField(
        max_length=16, choices=ModelStatus.choices, default=ModelStatus.ACTIVE
    )
    # Set by governance/services/model_lifecycle.py when the status becomes deprecated: the
    # ``Deprecation`` header's date, so no door may choose it.
    deprecated_at = models.DateTimeField(null=True, blank=True, editable=False)
    sunset_at = models.DateTimeField(
        null=True, blank=True, help_text="When a deprecated model stops being served as itself"
    )
    successor = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="predecessors",
        help_text="The model callers should move to (named in the notices and the 410)",
    )
    notice_url = models.URLField(
        blank=True, help_text="The deprecation notice clients are linked to (Link header)"
    )
    at_sunset = models.CharField(
        max_length=16,
        choices=AtSunset.choices,
        default=AtSunset.REFUSE,
        help_text="At the sunset: a 410, or the successor serving under the old id",
    )
    # Versions, aliases and the traffic split (governance/model_routing.py, docs/models.md).
    routing = models.JSONField(
        default=dict,
        blank=True,
        help_text='Which version answers: {"split": {"v1": 95, "v2": 5}, "sticky": '
        '"request" or "use_case", "aliases": {"stable": "v1"}}',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["public_id"]

    def __str__(self) -> str:
        return self.public_id

    def clean(self) -> None:
        _validate_string_list(self.capabilities, "capabilities", allowed=set(Capability.values))
        if not self.capabilities:
            raise ValidationError({"capabilities": "List at least one capability."})
        # The row's own lifecycle rules; those about the successor's row are in
        # governance/services/model_lifecycle.py.
        if self.status == ModelStatus.ACTIVE and self.sunset_at is not None:
            raise ValidationError(
                {"sunset_at": "An active model has no sunset: deprecate it to set one."}
            )
        if self.status == ModelStatus.DEPRECATED:
            missing = {
                name: "A deprecated model needs it."
                for name, value in (("sunset_at", self.sunset_at), ("successor", self.successor_id))
                if value is None
            }
            if missing:
                raise ValidationError(missing)
        if self.successor_id is not None and self.successor_id == self.pk:
            raise ValidationError({"successor": "A model cannot succeed itself."})
        versions = self.versions()
        try:
            self.routing = model_routing.clean_routing(self.routing, versions)
        except ValidationError as exc:
            raise ValidationError({"routing": exc.messages}) from None
        if self.pk is not None and not model_routing.pins_at_the_end():
            self._keep_pins(model_routing.targets(self.routing, versions))

    def _keep_pins(self, targets: set[str]) -> None:
        """A routing change may not take away a version or alias a use case is pinned to."""
        for use_case in UseCase.objects.filter(model_pins__has_key=self.public_id):
            pin = use_case.model_pins[self.public_id]
            if pin not in targets:
                raise ValidationError(
                    {
                        "routing": f"Use case {use_case} is pinned to '{pin}': move its pin "
                        "before this routing takes it away."
                    }
                )

    def versions(self) -> set[str]:
        """The version labels of the model's active deployments (none: no versions)."""
        if self.pk is None:
            return set()
        return set(
            self.deployments.filter(active=True)
            .exclude(version="")
            .values_list("version", flat=True)
        )


class ModelPrice(models.Model):
    """What a model's tokens cost from one moment on, in ``settings.CURRENCY`` per million.

    A price holds until the model's next one starts; spend is always priced with the price
    in force when the tokens were used, so a new price never changes what was spent before
    it (governance/prices.py keeps prices already in force from being rewritten).
    """

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="prices")
    effective_from = models.DateTimeField(help_text="When this price starts to apply")
    input_per_mtok = models.DecimalField(
        max_digits=18,
        decimal_places=6,
        validators=[MinValueValidator(0)],
        help_text="Price of a million prompt (input) tokens",
    )
    output_per_mtok = models.DecimalField(
        max_digits=18,
        decimal_places=6,
        validators=[MinValueValidator(0)],
        help_text="Price of a million completion (output) tokens",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model__public_id", "effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "effective_from"], name="model_price_effective_from"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from.isoformat()}"


class Deployment(models.Model):
    """Where a model runs: vLLM replicas serving it under one served name, on one node pool."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="deployments")
    served_name = models.CharField(max_length=128, validators=[model_id_validator])
    replicas = models.JSONField(default=list, help_text="Base URLs of the vLLM replicas")
    node_pool = models.CharField(max_length=64, blank=True, help_text="e.g. h100 or h200")
    version = models.CharField(
        max_length=32,
        blank=True,
        help_text="The model version this deployment serves (its checkpoint), e.g. v2; "
        "empty when the model has no versions",
    )
    lora_adapters = models.JSONField(
        default=list, blank=True, help_text="LoRA adapter names served on this base model"
    )
    max_in_flight_per_replica = models.PositiveIntegerField(
        default=64,
        validators=[MinValueValidator(1)],
        help_text="Requests the gateway sends one replica at once",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model__public_id", "id"]

    def __str__(self) -> str:
        return f"{self.model} → {self.served_name} ×{len(self.replicas)}"

    def clean(self) -> None:
        _validate_string_list(self.replicas, "replicas")
        if not self.replicas:
            raise ValidationError({"replicas": "List at least one replica base URL."})
        # A replica is a base URL, or a headless Service's name that the gateway resolves
        # to its pods (dns+http(s)://; gateway/discovery.py).
        bad = [url for url in self.replicas if not _replica_entry(url)]
        if bad:
            raise ValidationError(
                {
                    "replicas": f"{bad[0]!r} is not an http(s):// base URL "
                    "or a dns+http(s):// service name."
                }
            )
        _validate_string_list(self.lora_adapters, "lora_adapters")
        self._clean_version()

    def _clean_version(self) -> None:
        """Either all of a model's active deployments name a version or none does; and one
        that the model's routing names keeps at least one active deployment."""
        try:
            model_routing.clean_label(self.version)
        except ValidationError as exc:
            raise ValidationError({"version": exc.messages}) from None
        if self.model_id is None:
            return
        others = Deployment.objects.filter(model_id=self.model_id, active=True).exclude(pk=self.pk)
        if self.active and (
            others.filter(version="").exists()
            if self.version
            else others.exclude(version="").exists()
        ):
            raise ValidationError(
                {"version": "Name a version on all of this model's active deployments or on none."}
            )
        before = (
            Deployment.objects.filter(pk=self.pk).values_list("version", "active").first()
            if self.pk
            else None
        )
        if before is None or not before[1] or not before[0]:
            return
        if before[0] == self.version and self.active:
            return
        self._keep_routed_version(before[0], "deactivated or relabelled")

    def check_delete(self) -> None:
        """ValidationError when deleting this deployment would leave the model's routing
        naming a version with nothing to serve it (record_delete asks before deleting)."""
        if self.active and self.version:
            self._keep_routed_version(self.version, "deleted")

    def _keep_routed_version(self, version: str, change: str) -> None:
        others = Deployment.objects.filter(model_id=self.model_id, active=True, version=version)
        if others.exclude(pk=self.pk).exists():
            return
        routing = Model.objects.filter(pk=self.model_id).values_list("routing", flat=True).first()
        routing = routing or {}
        named = set(routing.get("split", {})) | set(routing.get("aliases", {}).values())
        if version in named:
            raise ValidationError(
                {
                    "version": f"Version '{version}' is in the model's routing (split or "
                    f"aliases) and this is its last active deployment: route it away before "
                    f"it is {change}."
                }
            )


def _replica_entry(url: str) -> bool:
    if is_service_name(url):
        try:
            ServiceName.parse(url)
        except ValueError:
            return False
        return True
    return url.startswith(("http://", "https://"))


class UseCase(models.Model):
    """One approved purpose of one tenant: what it may call, how, and under which controls."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="use_cases")
    slug = models.CharField(max_length=63, validators=[slug_validator])
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=UseCaseKind.choices)
    purpose = models.TextField()
    data_classification = models.CharField(
        max_length=12, choices=DataClassification.choices, default=DataClassification.INTERNAL
    )
    status = models.CharField(
        max_length=12, choices=UseCaseStatus.choices, default=UseCaseStatus.DRAFT, editable=False
    )
    status_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    status_changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    status_reason = models.TextField(blank=True, editable=False)
    namespace = models.CharField(max_length=8, choices=Namespace.choices, default=Namespace.DEV)
    allowed_models = models.ManyToManyField(Model, blank=True, related_name="use_cases")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    ticket_ref = models.CharField(max_length=64, blank=True, help_text="e.g. a ServiceNow ticket")
    service_account_client_id = models.CharField(
        "service-account client",
        max_length=255,
        blank=True,
        validators=[client_id_validator],
        # DRF's generated uniqueness check reads its message from here.
        error_messages={"unique": SERVICE_ACCOUNT_TAKEN},
        help_text="Keycloak client whose service-account tokens call the gateway as this use "
        "case (client-credentials grant); empty: none",
    )
    guardrail_failure = models.CharField(
        max_length=8,
        choices=GuardrailFailure.choices,
        default=GuardrailFailure.CLOSED,
        help_text="When a selected guardrail cannot run: refuse (closed, 503) or let the "
        "request through and record it (open)",
    )
    record_policy = models.CharField(
        max_length=8,
        choices=RecordPolicy.choices,
        default=RecordPolicy.METADATA,
        help_text="What the gateway keeps of each request: nothing, its metadata, or the "
        "full request and response (after redaction)",
    )
    record_retention_days = models.PositiveIntegerField(
        default=90,
        validators=[MinValueValidator(1)],
        help_text="Interaction records older than this are deleted (unless on legal hold)",
    )
    records_visible_to_developers = models.BooleanField(
        default=False,
        help_text="Whether the tenant's developers may read this use case's records "
        "(auditors and officers always may)",
    )
    legal_hold = models.BooleanField(
        default=False,
        help_text="Suspends the deletion of this use case's interaction records while set",
    )
    async_result_ttl_seconds = models.PositiveIntegerField(
        "async result lifetime (seconds)",
        default=600,
        validators=[MinValueValidator(10), MaxValueValidator(86_400)],
        help_text="How long an async task's result stays readable after it ends "
        "(GET /v1/tasks/{id}); then it is gone",
    )
    async_cache_seconds = models.PositiveIntegerField(
        "async result cache (seconds)",
        default=0,
        validators=[MaxValueValidator(86_400)],
        help_text="Reuse the result of an identical deterministic async task (embeddings, "
        "temperature 0) for this long; 0: no cache",
    )
    webhook_url = models.URLField(
        blank=True,
        max_length=500,
        help_text="Notified (signed, Standard Webhooks) when one of its files or batches ends",
    )
    # The webhook's signing secret, sealed (records/sealing.py); shown once when set.
    webhook_secret_sealed = models.TextField(blank=True, editable=False)
    # {public model id: version or alias}: the use case always gets that version, whatever
    # the model's split (governance/model_routing.py).
    model_pins = models.JSONField(
        default=dict,
        blank=True,
        help_text='Versions this use case is pinned to: {"model": "version or alias"}',
    )
    # {public model id: [fallback model ids, in order]}: who serves when the model would
    # refuse the request for capacity (docs/models.md, "Fallbacks").
    model_fallbacks = models.JSONField(
        default=dict,
        blank=True,
        help_text='Models that serve when a model is saturated or failing: {"model": '
        '["fallback", ...]}, each one the use case may call',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="use_case_slug_per_tenant"),
            models.UniqueConstraint(
                fields=["service_account_client_id"],
                condition=~models.Q(service_account_client_id=""),
                name="one_use_case_per_service_account",
                # Code "unique" on a one-field constraint: full_clean() reports it on the field.
                violation_error_code="unique",
                violation_error_message=SERVICE_ACCOUNT_TAKEN,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"

    def clean(self) -> None:
        self._clean_fallbacks()
        if not self.model_pins:
            self.model_pins = {}
            return
        names = list(self.model_pins) if isinstance(self.model_pins, dict) else []
        routes = {
            model.public_id: model_routing.targets(model.routing, model.versions())
            for model in Model.objects.filter(public_id__in=names)
        }
        try:
            self.model_pins = model_routing.clean_pins(self.model_pins, routes)
        except ValidationError as exc:
            raise ValidationError({"model_pins": exc.messages}) from None

    def _clean_fallbacks(self) -> None:
        """Each chain's models exist, none is the model it stands in for or named twice, at
        most ``MAX_FALLBACKS`` of them. That each is among the use case's models is checked
        by the services once the models are set (governance/services/model_fallbacks.py): a
        request may set both at once."""
        value = self.model_fallbacks
        if value in (None, ""):
            self.model_fallbacks = {}
            return
        if not isinstance(value, dict) or not all(
            isinstance(chain, list) and all(isinstance(name, str) for name in chain)
            for chain in value.values()
        ):
            raise ValidationError(
                {"model_fallbacks": 'Give a JSON object: {"model": ["fallback", ...]}.'}
            )
        named = set(value) | {name for chain in value.values() for name in chain}
        known = set(Model.objects.filter(public_id__in=named).values_list("public_id", flat=True))
        for model, chain in value.items():
            problem = _fallback_problem(model, chain, known)
            if problem is not None:
                raise ValidationError({"model_fallbacks": problem})


def stale_pins() -> list[tuple[UseCase, str, str]]:
    """(use case, model, pin) for each pin that names no version or alias of its model now:
    what a change made in steps checks at its end (``model_routing.pins_checked_at_the_end``)."""
    stale = []
    for use_case in UseCase.objects.exclude(model_pins={}).select_related("tenant"):
        for model_id, pin in use_case.model_pins.items():
            model = Model.objects.filter(public_id=model_id).first()
            targets = model_routing.targets(model.routing, model.versions()) if model else set()
            if pin not in targets:
                stale.append((use_case, model_id, pin))
    return stale


def _fallback_problem(model: str, chain: list[str], known: set[str]) -> str | None:
    unknown = [name for name in (model, *chain) if name not in known]
    if unknown:
        return f"'{unknown[0]}' is not a model."
    if model in chain:
        return f"'{model}' cannot fall back to itself."
    if len(set(chain)) != len(chain):
        return f"'{model}': a fallback is listed twice."
    if not 1 <= len(chain) <= MAX_FALLBACKS:
        return f"'{model}': give 1 to {MAX_FALLBACKS} fallbacks."
    return None


class GuardrailSelection(models.Model):
    """One guardrail a use case applies, on one side of the call (or both), in one mode.

    ``guardrail`` names a catalogue entry (``guardrails.catalogue``), built-in or a company's
    own detector, so there is no fixed list of choices here; ``config`` holds the settings as
    the detector validated them (defaults filled in). Selections run in ``position`` order.
    The services (``governance.guardrails``) validate a selection against the catalogue and
    the registered models; ``clean`` guards only what one row can know.
    """

    use_case = models.ForeignKey(UseCase, on_delete=models.CASCADE, related_name="guardrails")
    guardrail = models.CharField(max_length=64, validators=[guardrail_name_validator])
    side = models.CharField(max_length=8, choices=GuardrailSide.choices)
    action = models.CharField(max_length=8, choices=GuardrailAction.choices)
    config = models.JSONField(default=dict, blank=True, help_text="Guardrail-specific settings")
    position = models.PositiveSmallIntegerField(
        default=0, help_text="Order in which the use case's guardrails run (smallest first)"
    )

    class Meta:
        ordering = ["use_case_id", "position", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["use_case", "guardrail", "side"], name="one_selection_per_guardrail_side"
            )
        ]

    def __str__(self) -> str:
        return f"{self.guardrail} on {self.side}: {self.action}"

    def clean(self) -> None:
        if not isinstance(self.config, dict):
            raise ValidationError({"config": "Give a JSON object."})


class PriorityClass(models.Model):
    """A service class: its rank in the gateway's queue and what vLLM is told."""

    name = models.CharField(max_length=32, unique=True, validators=[slug_validator])
    rank = models.PositiveSmallIntegerField(
        unique=True, help_text="0 is served first; larger numbers wait behind smaller ones"
    )
    vllm_priority = models.IntegerField(
        help_text="Sent as vLLM's request priority (lower is scheduled earlier)"
    )
    queue_timeout_seconds = models.FloatField(default=30.0, validators=[MinValueValidator(0.0)])
    max_queue_length = models.PositiveIntegerField(default=1000)
    max_pool_share = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.001), MaxValueValidator(1.0)],
        help_text="The most of a model's replica slots this class may hold at once (1: all). "
        "Give file and batch classes less, so interactive classes always find room",
    )
    degrade_after_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0)],
        help_text="For a use case with fallback models: how long a request of this class "
        "waits on a saturated model before its fallback serves it (0: at once). Empty: only "
        "when the model refuses it (queue full or timeout). Set it on dev and batch classes "
        "so that prod keeps the large model under a burst",
    )

    class Meta:
        ordering = ["rank"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return f"{self.name} (rank {self.rank})"


class PriorityRule(models.Model):
    """One cell of the priority matrix: tenant environment × caller namespace → class."""

    environment = models.CharField(max_length=8, choices=Environment.choices)
    namespace = models.CharField(max_length=8, choices=Namespace.choices)
    priority_class = models.ForeignKey(
        PriorityClass, on_delete=models.PROTECT, related_name="rules"
    )

    class Meta:
        ordering = ["environment", "namespace"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "namespace"], name="one_class_per_cell")
        ]

    def __str__(self) -> str:
        return f"{self.environment} × {self.namespace} → {self.priority_class.name}"


class RateLimitPolicy(models.Model):
    """A limit at the global, model, tenant or tenant × model level (use cases carry their own)."""

    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=14, choices=RateLimitScope.choices)
    model = models.ForeignKey(Model, null=True, blank=True, on_delete=models.CASCADE)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["scope", "name"]
        verbose_name_plural = "rate-limit policies"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        needs_model = self.scope in (RateLimitScope.MODEL, RateLimitScope.TENANT_MODEL)
        needs_tenant = self.scope in (RateLimitScope.TENANT, RateLimitScope.TENANT_MODEL)
        errors: dict[str, str] = {}
        if needs_model and self.model_id is None:
            errors["model"] = f"A {self.scope} limit names a model."
        if not needs_model and self.model_id is not None:
            errors["model"] = f"A {self.scope} limit does not name a model."
        if needs_tenant and self.tenant_id is None:
            errors["tenant"] = f"A {self.scope} limit names a tenant."
        if not needs_tenant and self.tenant_id is not None:
            errors["tenant"] = f"A {self.scope} limit does not name a tenant."
        if not any((self.requests_per_minute, self.tokens_per_minute, self.tokens_per_day)):
            errors["requests_per_minute"] = "Set at least one limit."
        if errors:
            raise ValidationError(errors)


class ApiKey(models.Model):
    """An API key of a use case, stored only as its SHA-256.

    Requested by a developer, decided by an officer. The secret is generated only when its
    requester reveals it, once; so no plaintext ever rests anywhere, not even briefly.
    """

    use_case = models.ForeignKey(UseCase, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requested_keys",
    )
    status = models.CharField(
        max_length=10, choices=ApiKeyStatus.choices, default=ApiKeyStatus.PENDING, editable=False
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    decided_at = models.DateTimeField(null=True, blank=True, editable=False)
    decision_reason = models.TextField(blank=True, editable=False)
    prefix = models.CharField(max_length=16, blank=True, db_index=True, editable=False)
    # NULL until revealed: unique, and many unrevealed keys must not collide on "".
    key_hash = models.CharField(max_length=64, null=True, unique=True, editable=False)  # noqa: DJ001
    revealed_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    rotated_from = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="rotated_to",
        editable=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix or 'unrevealed'}… {self.name} ({self.use_case})"


class AuditChainHead(models.Model):
    """The single row that serialises appends to the audit chain (locked FOR UPDATE)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    last_sequence = models.PositiveBigIntegerField(default=0)
    last_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"audit head #{self.last_sequence}"


class AuditEvent(models.Model):
    """One entry of the append-only, hash-chained audit trail.

    ``hash`` covers every field and the previous event's hash, so changing, removing or
    reordering any event breaks every link after it; ``governance.audit`` verifies the chain.
    """

    sequence = models.PositiveBigIntegerField(unique=True, editable=False)
    occurred_at = models.DateTimeField(editable=False, db_index=True)
    actor = models.CharField(max_length=150, editable=False, help_text="username, or system:…")
    action = models.CharField(max_length=64, editable=False, db_index=True)
    object_type = models.CharField(max_length=64, editable=False, blank=True)
    object_id = models.CharField(max_length=64, editable=False, blank=True)
    object_repr = models.CharField(max_length=200, editable=False, blank=True)
    # History is keyed by the tenant's id: a slug can be renamed, and then reused by another
    # tenant. The slug stays as it was at the time, for display. Not a foreign key: the trail
    # outlives a deleted tenant and is never updated.
    tenant_id = models.BigIntegerField(null=True, blank=True, editable=False, db_index=True)
    tenant_slug = models.CharField(max_length=63, editable=False, blank=True, db_index=True)
    before = models.JSONField(null=True, editable=False)
    after = models.JSONField(null=True, editable=False)
    request_id = models.CharField(max_length=128, editable=False, blank=True)
    source_ip = models.GenericIPAddressField(null=True, editable=False)
    prev_hash = models.CharField(max_length=64, editable=False)
    hash = models.CharField(max_length=64, editable=False, unique=True)
    # Which fields the hash covers: null for events written before ``tenant_id`` existed (their
    # tenant id was filled in later, outside the hash), 2 for events whose hash covers it.
    hash_version = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["sequence"]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.action} {self.object_type}:{self.object_id} by {self.actor}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValidationError("Audit events are append-only: they cannot be changed.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValidationError("Audit events are append-only: they cannot be deleted.")


class SlaClass(models.Model):
    """A use case's promise for file work, set by officers: how fast (``turnaround_seconds``,
    or ``None``: by the end of the next processing window), when batch work may run
    (``windows``: ``[{"days": ["mon", …], "start": "20:00", "end": "06:00"}]`` in ``time_zone``;
    empty: any time), at which priority class, and which files it takes."""

    use_case = models.ForeignKey(UseCase, on_delete=models.CASCADE, related_name="sla_classes")
    name = models.CharField(max_length=63, validators=[slug_validator])
    description = models.CharField(max_length=300, blank=True)
    turnaround_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Done within this long of the upload; empty: by the end of the next window",
    )
    windows = models.JSONField(default=list, blank=True, help_text="When the work may run")
    time_zone = models.CharField(max_length=64, default="UTC")
    priority_class = models.ForeignKey(
        "PriorityClass", on_delete=models.PROTECT, related_name="sla_classes"
    )
    max_file_bytes = models.PositiveBigIntegerField(default=512 * 1024 * 1024)
    kinds = models.JSONField(
        default=list, help_text="File kinds it takes (audio, pdf, text, batch)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["use_case", "name"]
        constraints = [
            models.UniqueConstraint(fields=["use_case", "name"], name="sla_class_name_per_use_case")
        ]

    def __str__(self) -> str:
        return f"{self.use_case}:{self.name}"


class FileRegistration(models.Model):
    """A file announced before it arrives, with the SLA asked for and what was promised.

    Audited like every governance record. ``estimated_tokens`` and ``promised_by`` are the
    feasibility answer (scheduler/files/feasibility.py) the registration was accepted with."""

    use_case = models.ForeignKey(UseCase, on_delete=models.PROTECT, related_name="files")
    registered_by = models.CharField(max_length=150, help_text="username, or key:<prefix>")
    api_key = models.ForeignKey(
        "ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="files"
    )
    kind = models.CharField(max_length=8, choices=FileKind.choices)
    filename = models.CharField(max_length=255)
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="files")
    declared_bytes = models.PositiveBigIntegerField()
    declared_seconds = models.FloatField(null=True, blank=True, help_text="Audio duration")
    declared_pages = models.PositiveIntegerField(null=True, blank=True)
    declared_lines = models.PositiveIntegerField(null=True, blank=True)
    sla_class = models.ForeignKey(
        SlaClass, null=True, blank=True, on_delete=models.PROTECT, related_name="files"
    )
    deadline = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=FileState.choices, default=FileState.REGISTERED)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    progress = models.FloatField(default=0.0, help_text="0 to 1")
    estimated_tokens = models.PositiveBigIntegerField()
    promised_by = models.DateTimeField(help_text="The completion time promised")
    outputs = models.JSONField(default=dict, blank=True, help_text="Output object names")
    failure = models.TextField(blank=True)
    # What arrived (set by file_uploaded): the object in the files bucket, its size and digest.
    uploaded_at = models.DateTimeField(null=True, blank=True)
    source_object = models.CharField(max_length=1024, blank=True)
    source_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    source_sha256 = models.CharField(max_length=64, blank=True)
    # The OpenAI Batch API's own fields (kind "batch" created through /v1/batches).
    input_file = models.ForeignKey(
        "ApiFile", null=True, blank=True, on_delete=models.PROTECT, related_name="batches"
    )
    request_endpoint = models.CharField(
        max_length=64, blank=True, help_text="Batch lines' endpoint, e.g. /v1/chat/completions"
    )
    metadata = models.JSONField(default=dict, blank=True, help_text="The client's own labels")
    counts = models.JSONField(
        default=dict, blank=True, help_text="Tallies: batch total/completed/failed, audio seconds…"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["use_case", "state"], name="file_use_case_state"),
            models.Index(fields=["state", "promised_by"], name="file_state_promise"),
        ]

    def __str__(self) -> str:
        return f"{self.use_case}: {self.filename} ({self.state})"


class S3Credential(models.Model):
    """An S3 access key pair a use case uploads its registered files with (s3endpoint/).

    Issued by Switchyard, revealed once. The secret is stored sealed (records/sealing.py),
    not hashed: verifying AWS Signature V4 needs the secret itself. Rotatable like API keys:
    a rotation issues a new pair and revokes the old one after ``grace`` (docs/files.md)."""

    use_case = models.ForeignKey(UseCase, on_delete=models.CASCADE, related_name="s3_credentials")
    name = models.CharField(max_length=200, blank=True)
    access_key_id = models.CharField(max_length=32, unique=True, editable=False)
    secret_sealed = models.TextField(editable=False)
    status = models.CharField(
        max_length=10, choices=ApiKeyStatus.choices, default=ApiKeyStatus.ACTIVE, editable=False
    )
    created_by = models.CharField(max_length=150, help_text="username, or key:<prefix>")
    created_at = models.DateTimeField(auto_now_add=True)
    revealed_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    rotated_from = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="rotated_to",
        editable=False,
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.use_case}: {self.access_key_id}"


class ApiFile(models.Model):
    """A file of the OpenAI Files API (``/v1/files``): a batch's input, output or error file.

    The content lives in the files bucket under ``object_name``; ``public_id`` ("file-…") is
    what clients see. Scoped to one use case: another use case's keys never see it."""

    public_id = models.CharField(max_length=40, unique=True, editable=False)
    use_case = models.ForeignKey(UseCase, on_delete=models.PROTECT, related_name="api_files")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="api_files"
    )
    purpose = models.CharField(max_length=16, help_text="batch, batch_output, batch_error")
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    object_name = models.CharField(max_length=1024)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["use_case", "purpose"], name="apifile_use_case_purpose")]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.purpose})"
