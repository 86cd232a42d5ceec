"""The governance API. Viewsets are thin: scope the queryset, parse, call a service, serialize.

Authorisation lives in the services (who may change what) and in the selectors (who may see
what): an object outside a person's scope is a 404, an action they may not take a 403.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar, cast

from django.core.exceptions import ValidationError
from django.db.models import Model as DjangoModel
from django.db.models import QuerySet
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, mixins, permissions, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from governance.api import serializers as s
from governance.api.filtersets import ApiKeyFilterSet, GuardrailSelectionFilterSet
from governance.audit import Actor, audit_verify
from governance.guardrail_selections import catalogue_items
from governance.models import (
    ApiKey,
    AuditEvent,
    Deployment,
    GuardrailSelection,
    Model,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    Tenant,
    UseCase,
)
from governance.prices import model_price_add
from governance.roles import AnyUser, can_govern, can_read_everything, roles_of, visible_tenants
from governance.selectors import (
    api_keys_visible,
    audit_events_visible,
    guardrails_visible,
    rate_limits_visible,
    use_cases_visible,
)
from governance.services.api_keys import (
    api_key_decide,
    api_key_request,
    api_key_reveal,
    api_key_revoke,
    api_key_rotate,
)
from governance.services.generic_records import record_create, record_delete, record_update
from governance.services.guardrail_selections import (
    guardrail_add,
    guardrail_change,
    guardrail_remove,
    guardrail_reorder,
)
from governance.services.record_policy import tenant_set_legal_hold, use_case_set_legal_hold
from governance.services.use_cases import use_case_create, use_case_transition, use_case_update


class HasSwitchyardRole(permissions.BasePermission):
    """Signed in is not enough: the API is for people (and service accounts) with a role."""

    message = "Your account has no Switchyard role; ask an administrator for one."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and request.user.is_authenticated and roles_of(request.user))


class GovernsFleet(permissions.BasePermission):
    """The fleet's deployments carry its internal addresses (replica URLs): officers and
    admins only. Everyone with a role still reads the model catalogue."""

    message = "Only governance officers and admins see the fleet's deployments."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return can_govern(request.user)


class ScopedRelations(generics.GenericAPIView):  # type: ignore[type-arg]
    """Related records a person names in a body are looked up in their scope only, so a
    record outside it gets the same answer as one that does not exist (no existence leak)."""

    # field name → (the person's scope of that relation, the words for "not found")
    scoped_relations: ClassVar[dict[str, tuple[Callable[[AnyUser], QuerySet[Any]], str]]] = {}

    def get_serializer(self, *args: Any, **kwargs: Any) -> BaseSerializer[Any]:
        serializer: BaseSerializer[Any] = super().get_serializer(*args, **kwargs)
        fields = getattr(serializer, "fields", {})
        for name, (scope, missing) in self.scoped_relations.items():
            if name in fields:
                fields[name].queryset = scope(self.request.user)
                fields[name].error_messages["does_not_exist"] = missing
        return serializer


def actor_of(request: Request) -> Actor:
    return Actor.from_request(cast(HttpRequest, request))


class GovernedViewSet(viewsets.ModelViewSet):  # type: ignore[type-arg]
    """CRUD for records that only officers change; every write through the record services."""

    permission_classes: tuple[type[permissions.BasePermission], ...] = (HasSwitchyardRole,)
    m2m_fields: ClassVar[tuple[str, ...]] = ()

    def _split(self, serializer: BaseSerializer[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        data = dict(serializer.validated_data)
        m2m = {name: data.pop(name) for name in self.m2m_fields if name in data}
        return data, m2m

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        data, m2m = self._split(serializer)
        model = cast(type[DjangoModel], self.get_queryset().model)
        serializer.instance = record_create(
            actor=actor_of(self.request), instance=model(**data), m2m=m2m
        )

    def perform_update(self, serializer: BaseSerializer[Any]) -> None:
        data, m2m = self._split(serializer)
        serializer.instance = record_update(
            actor=actor_of(self.request),
            instance=cast(DjangoModel, serializer.instance),
            changes=data,
            m2m=m2m or None,
        )

    def perform_destroy(self, instance: DjangoModel) -> None:
        record_delete(actor=actor_of(self.request), instance=instance)


class TenantViewSet(GovernedViewSet):
    serializer_class = s.TenantSerializer
    m2m_fields = ("members",)
    lookup_field = "slug"
    filterset_fields = ("environment", "business_unit")
    search_fields = ("slug", "name", "application_id", "business_unit")
    ordering_fields = ("slug", "created_at")

    def get_queryset(self) -> QuerySet[Tenant]:
        return visible_tenants(self.request.user).prefetch_related("members")

    @extend_schema(request=s.LegalHoldSerializer, responses=s.TenantSerializer)
    @action(detail=True, methods=["post"], url_path="legal-hold")
    def legal_hold(self, request: Request, slug: str | None = None) -> Response:
        """Place or lift a legal hold on every use case's records of the tenant (officers)."""
        body = s.LegalHoldSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = tenant_set_legal_hold(
            actor=actor_of(request), tenant=self.get_object(), **body.validated_data
        )
        return Response(s.TenantSerializer(tenant).data)


class ModelViewSet(GovernedViewSet):
    """The model catalogue: every model the fleet offers and where it runs."""

    serializer_class = s.ModelSerializer
    queryset = Model.objects.prefetch_related("deployments", "prices")
    lookup_field = "public_id"
    lookup_value_regex = r"[^/]+"
    search_fields = ("public_id", "description")

    @extend_schema(request=s.ModelPriceInputSerializer, responses={201: s.ModelPriceSerializer})
    @action(detail=True, methods=["post"], url_path="prices")
    def add_price(self, request: Request, public_id: str | None = None) -> Response:
        """Add a price to the model's history (officers). It applies from ``effective_from``
        until the next price; a price already in force is never changed (docs/policy-as-code.md
        "Prices")."""
        body = s.ModelPriceInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        price = model_price_add(
            actor=actor_of(request), model=self.get_object(), **body.validated_data
        )
        return Response(s.ModelPriceSerializer(price).data, status=201)


class DeploymentViewSet(GovernedViewSet):
    serializer_class = s.DeploymentSerializer
    permission_classes = (HasSwitchyardRole, GovernsFleet)
    queryset = Deployment.objects.select_related("model")
    filterset_fields = ("model__public_id", "node_pool", "active")


# A selection's id in a path: digits only (the route's pattern), within a bigint.
SELECTION_ID = OpenApiParameter(
    "selection_id",
    {"type": "integer", "minimum": 0, "maximum": 10**18 - 1},
    OpenApiParameter.PATH,
)


class GuardrailSelectionViewSet(ScopedRelations, GovernedViewSet):
    """Every use case's guardrail selections; officers change them (through the guardrail
    services: catalogue-validated, audited, republished)."""

    serializer_class = s.GuardrailSelectionSerializer
    filterset_class = GuardrailSelectionFilterSet
    scoped_relations = {"use_case": (use_cases_visible, "No such use case.")}

    def get_queryset(self) -> QuerySet[GuardrailSelection]:
        return guardrails_visible(self.request.user).order_by("use_case_id", "position", "pk")

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = guardrail_add(actor=actor_of(self.request), **data)

    def perform_update(self, serializer: BaseSerializer[Any]) -> None:
        data = dict(serializer.validated_data)
        instance = cast(GuardrailSelection, serializer.instance)
        if "use_case" in data and data.pop("use_case") != instance.use_case:
            raise ValidationError({"use_case": "A selection cannot move to another use case."})
        serializer.instance = guardrail_change(
            actor=actor_of(self.request), selection=instance, changes=data
        )

    def perform_destroy(self, instance: DjangoModel) -> None:
        guardrail_remove(actor=actor_of(self.request), selection=cast(GuardrailSelection, instance))


class PriorityClassViewSet(GovernedViewSet):
    serializer_class = s.PriorityClassSerializer
    queryset = PriorityClass.objects.all()
    lookup_field = "name"


class PriorityRuleViewSet(GovernedViewSet):
    """The priority matrix, one cell a row: tenant environment × caller namespace → class."""

    serializer_class = s.PriorityRuleSerializer
    queryset = PriorityRule.objects.select_related("priority_class")
    filterset_fields = ("environment", "namespace", "priority_class__name")


class RateLimitPolicyViewSet(GovernedViewSet):
    serializer_class = s.RateLimitPolicySerializer
    filterset_fields = ("scope", "model__public_id", "tenant__slug")

    def get_queryset(self) -> QuerySet[RateLimitPolicy]:
        return rate_limits_visible(self.request.user).select_related("model", "tenant")


def visible_use_case_or_404(user: Any, pk: str) -> UseCase:
    """The use case ``pk`` names, if the user may see it; else a JSON 404. For views under
    ``/api/use-cases/<id>/`` outside the viewset: any segment reaches them, as with the
    router's own routes."""
    found = use_cases_visible(user).filter(pk=int(pk)).first() if pk.isdigit() else None
    if found is None:
        raise NotFound("No such use case.")
    return found


class UseCaseViewSet(
    ScopedRelations,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Use cases: developers draft and submit; officers approve, suspend, retire.

    There is no DELETE: a use case that is no longer wanted is retired, and stays on record.
    """

    serializer_class = s.UseCaseSerializer
    permission_classes = (HasSwitchyardRole,)
    scoped_relations = {"tenant": (visible_tenants, "No such tenant.")}
    filterset_fields = ("tenant__slug", "status", "kind", "namespace", "data_classification")
    search_fields = ("slug", "name", "purpose", "ticket_ref")
    ordering_fields = ("created_at", "slug", "status")

    def get_queryset(self) -> QuerySet[UseCase]:
        return use_cases_visible(self.request.user).prefetch_related("allowed_models", "guardrails")

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        data = dict(serializer.validated_data)
        tenant = data.pop("tenant")
        allowed_models = data.pop("allowed_models", None)
        serializer.instance = use_case_create(
            actor=actor_of(self.request), tenant=tenant, fields=data, allowed_models=allowed_models
        )

    def perform_update(self, serializer: BaseSerializer[Any]) -> None:
        data = dict(serializer.validated_data)
        data.pop("tenant", None)  # validated unchanged by the serializer
        allowed_models = data.pop("allowed_models", None)
        serializer.instance = use_case_update(
            actor=actor_of(self.request),
            use_case=cast(UseCase, serializer.instance),
            changes=data,
            allowed_models=allowed_models,
        )

    def _transition(self, request: Request, name: str) -> Response:
        body = s.UseCaseTransitionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        use_case = use_case_transition(
            actor=actor_of(request),
            use_case=self.get_object(),
            transition=name,
            reason=body.validated_data["reason"],
        )
        return Response(s.UseCaseSerializer(use_case).data)

    @extend_schema(request=s.UseCaseTransitionSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def submit(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "submit")

    @extend_schema(request=s.UseCaseTransitionSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "approve")

    @extend_schema(request=s.ReasonRequiredSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "reject")

    @extend_schema(request=s.ReasonRequiredSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "suspend")

    @extend_schema(request=s.UseCaseTransitionSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def reinstate(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "reinstate")

    @extend_schema(request=s.UseCaseTransitionSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, "retire")

    @extend_schema(request=s.LegalHoldSerializer, responses=s.UseCaseSerializer)
    @action(detail=True, methods=["post"], url_path="legal-hold")
    def legal_hold(self, request: Request, pk: str | None = None) -> Response:
        """Place or lift a legal hold on the use case's records (officers)."""
        body = s.LegalHoldSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        use_case = use_case_set_legal_hold(
            actor=actor_of(request), use_case=self.get_object(), **body.validated_data
        )
        return Response(s.UseCaseSerializer(use_case).data)

    @extend_schema(methods=["get"], request=None, responses=s.UseCaseGuardrailSerializer(many=True))
    @extend_schema(
        methods=["post"],
        request=s.UseCaseGuardrailSerializer,
        responses={201: s.UseCaseGuardrailSerializer},
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def guardrails(self, request: Request, pk: str | None = None) -> Response:
        """The use case's guardrails in the order they run; POST selects one more (officers)."""
        use_case = self.get_object()
        if request.method == "GET":
            selections = use_case.guardrails.order_by("position", "pk")
            return Response(s.UseCaseGuardrailSerializer(selections, many=True).data)
        body = s.UseCaseGuardrailSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        selection = guardrail_add(actor=actor_of(request), use_case=use_case, **body.validated_data)
        return Response(s.UseCaseGuardrailSerializer(selection).data, status=201)

    @extend_schema(
        methods=["get"],
        parameters=[SELECTION_ID],
        request=None,
        responses=s.UseCaseGuardrailSerializer,
    )
    @extend_schema(
        methods=["patch"],
        parameters=[SELECTION_ID],
        request=s.PatchedUseCaseGuardrailSerializer,
        responses=s.UseCaseGuardrailSerializer,
    )
    @extend_schema(
        methods=["delete"],
        parameters=[SELECTION_ID],
        request=None,
        responses={204: None},
    )
    @action(
        detail=True,
        methods=["get", "patch", "delete"],
        url_path=r"guardrails/(?P<selection_id>[0-9]+)",
    )
    def guardrail(
        self, request: Request, pk: str | None = None, selection_id: str = ""
    ) -> Response:
        """One of the use case's selections: read it; change or remove it (officers)."""
        use_case = self.get_object()
        selection = None
        if len(selection_id) <= 18:  # digits (the route says so), within a bigint
            selection = use_case.guardrails.filter(pk=int(selection_id)).first()
        if selection is None:
            raise NotFound("No such guardrail selection for this use case.")
        if request.method == "GET":
            return Response(s.UseCaseGuardrailSerializer(selection).data)
        if request.method == "DELETE":
            guardrail_remove(actor=actor_of(request), selection=selection)
            return Response(status=204)
        body = s.UseCaseGuardrailSerializer(selection, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        changed = guardrail_change(
            actor=actor_of(request), selection=selection, changes=dict(body.validated_data)
        )
        return Response(s.UseCaseGuardrailSerializer(changed).data)

    @extend_schema(
        request=s.GuardrailReorderSerializer, responses=s.UseCaseGuardrailSerializer(many=True)
    )
    @action(detail=True, methods=["post"], url_path="guardrails/reorder")
    def reorder_guardrails(self, request: Request, pk: str | None = None) -> Response:
        """Run the use case's guardrails in the order given (every selection id, once)."""
        body = s.GuardrailReorderSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        selections = guardrail_reorder(
            actor=actor_of(request), use_case=self.get_object(), order=body.validated_data["order"]
        )
        return Response(s.UseCaseGuardrailSerializer(selections, many=True).data)


def _secret_response(key: ApiKey, secret: str) -> Response:
    response = Response(s.RevealedKeySerializer({"key": key, "secret": secret}).data)
    # The secret must not linger in any cache between here and the person who asked.
    response["Cache-Control"] = "no-store"
    response["Pragma"] = "no-cache"
    return response


class ApiKeyViewSet(
    ScopedRelations,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """API keys: request (POST), approve/reject, reveal once, rotate, revoke.

    Listing never shows a secret or its hash; only ``reveal`` and ``rotate`` return a secret,
    once, to the person entitled to it.
    """

    serializer_class = s.ApiKeySerializer
    permission_classes = (HasSwitchyardRole,)
    scoped_relations = {"use_case": (use_cases_visible, "No such use case.")}
    filterset_class = ApiKeyFilterSet
    search_fields = ("name", "prefix")
    ordering_fields = ("created_at", "expires_at", "last_used_at")

    def get_queryset(self) -> QuerySet[ApiKey]:
        return api_keys_visible(self.request.user)

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        data = serializer.validated_data
        use_case = data["use_case"]  # within the person's scope (ScopedRelations)
        serializer.instance = api_key_request(
            actor=actor_of(self.request),
            use_case=use_case,
            name=data["name"],
            reason=data["reason"],
            expires_at=data.get("expires_at"),
        )

    def _decide(self, request: Request, approve: bool) -> Response:
        body = s.ApiKeyDecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = api_key_decide(
            actor=actor_of(request),
            key=self.get_object(),
            approve=approve,
            reason=body.validated_data["reason"],
        )
        return Response(s.ApiKeySerializer(key).data)

    @extend_schema(request=s.ApiKeyDecisionSerializer, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=True)

    @extend_schema(request=s.ReasonRequiredSerializer, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=False)

    @extend_schema(request=None, responses=s.RevealedKeySerializer)
    @action(detail=True, methods=["post"])
    def reveal(self, request: Request, pk: str | None = None) -> Response:
        key, secret = api_key_reveal(actor=actor_of(request), key=self.get_object())
        return _secret_response(key, secret)

    @extend_schema(request=s.ApiKeyRotateSerializer, responses=s.RevealedKeySerializer)
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk: str | None = None) -> Response:
        body = s.ApiKeyRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        grace = body.validated_data.get("grace_seconds")
        key, secret = api_key_rotate(
            actor=actor_of(request),
            key=self.get_object(),
            grace=timedelta(seconds=grace) if grace is not None else None,
        )
        return _secret_response(key, secret)

    @extend_schema(request=s.ApiKeyDecisionSerializer, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        body = s.ApiKeyDecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = api_key_revoke(
            actor=actor_of(request), key=self.get_object(), reason=body.validated_data["reason"]
        )
        return Response(s.ApiKeySerializer(key).data)


class CanVerifyAudit(permissions.BasePermission):
    message = "Only officers, auditors and admins verify the audit trail."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return can_read_everything(request.user)


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """The audit trail, read-only. Developers see their own tenants' events only."""

    serializer_class = s.AuditEventSerializer
    permission_classes = (HasSwitchyardRole,)
    lookup_field = "sequence"
    filterset_fields = (
        "action",
        "actor",
        "tenant_id",
        "tenant_slug",
        "object_type",
        "object_id",
        "request_id",
    )
    search_fields = ("actor", "object_repr", "action")
    ordering_fields = ("sequence", "occurred_at")

    def get_queryset(self) -> QuerySet[AuditEvent]:
        return audit_events_visible(self.request.user)

    @extend_schema(responses={200: s.ChainReportSerializer, 409: s.ChainReportSerializer})
    @action(detail=False, methods=["get"], permission_classes=(HasSwitchyardRole, CanVerifyAudit))
    def verify(self, request: Request) -> Response:
        """Walk the whole hash chain; report the first broken link, if any."""
        report = audit_verify()
        return Response(s.ChainReportSerializer(report).data, status=200 if report.ok else 409)


class MeView(APIView):
    """Who am I to Switchyard: my roles and the tenants I belong to."""

    permission_classes = (permissions.IsAuthenticated,)

    @extend_schema(responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(
            s.MeSerializer(
                {
                    "username": request.user.get_username(),
                    "roles": sorted(roles_of(request.user)),
                    "tenants": list(visible_tenants(request.user).values_list("slug", flat=True)),
                }
            ).data
        )


class GuardrailCatalogueView(APIView):
    """Every guardrail a use case may select: its stages, modes, where it runs and what it
    does (the built-in ones and the company's own)."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(responses=s.CatalogueEntrySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(s.CatalogueEntrySerializer(catalogue_items(), many=True).data)
