"""Reads for the portal pages: what a person may see, and which actions to offer them.

Every query starts from ``visible_tenants``, so a developer's pages can only ever hold their
own tenants' rows; a row outside that scope is simply not found (a 404, so its existence does
not leak). The action flags only decide which buttons to draw: the services re-check every
action, whatever the page offered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.urls import reverse
from django.utils import timezone

from governance.choices import ApiKeyStatus, ModelStatus, UseCaseStatus
from governance.models import ApiKey, Model, UseCase
from governance.roles import (
    AnyUser,
    Role,
    can_govern,
    has_role,
    visible_tenants,
)
from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour
from records.selectors import admission_decisions_visible, guardrail_findings_visible


@dataclass(frozen=True)
class CatalogueEntry:
    public_id: str
    capabilities: list[str]
    replica_count: int


def model_catalogue() -> list[CatalogueEntry]:
    return [
        CatalogueEntry(
            public_id=model.public_id,
            capabilities=list(model.capabilities),
            replica_count=sum(len(d.replicas) for d in model.deployments.all() if d.active),
        )
        for model in Model.objects.prefetch_related("deployments")
    ]


# --- scoped querysets -----------------------------------------------------------------------
def use_cases_visible(user: AnyUser) -> QuerySet[UseCase]:
    return (
        UseCase.objects.filter(tenant__in=visible_tenants(user))
        .select_related("tenant", "status_changed_by")
        .prefetch_related("allowed_models")
    )


def keys_visible(user: AnyUser) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(use_case__tenant__in=visible_tenants(user)).select_related(
        "use_case__tenant", "requested_by", "decided_by", "rotated_from"
    )


def can_act(user: AnyUser) -> bool:
    """Whether the person may change anything at all (auditors only read)."""
    return has_role(user, Role.DEVELOPER, Role.OFFICER, Role.ADMIN)


def _is_member(user: AnyUser, use_case: UseCase) -> bool:
    if not user.is_authenticated or not has_role(user, Role.DEVELOPER):
        return False
    return use_case.tenant.members.filter(pk=user.pk).exists()


# --- the officer's queue --------------------------------------------------------------------
@dataclass(frozen=True)
class ReviewQueue:
    pending_keys: list[ApiKey]
    submitted_use_cases: list[UseCase]
    suspended_use_cases: list[UseCase]

    @property
    def size(self) -> int:
        return len(self.pending_keys) + len(self.submitted_use_cases)


def review_queue(user: AnyUser) -> ReviewQueue:
    use_cases = use_cases_visible(user)
    return ReviewQueue(
        pending_keys=list(
            keys_visible(user).filter(status=ApiKeyStatus.PENDING).order_by("created_at")
        ),
        submitted_use_cases=list(
            use_cases.filter(status=UseCaseStatus.SUBMITTED).order_by("updated_at")
        ),
        suspended_use_cases=list(
            use_cases.filter(status=UseCaseStatus.SUSPENDED).order_by("-status_changed_at")
        ),
    )


def review_queue_size() -> int:
    return (
        ApiKey.objects.filter(status=ApiKeyStatus.PENDING).count()
        + UseCase.objects.filter(status=UseCaseStatus.SUBMITTED).count()
    )


# --- what to offer on a page ----------------------------------------------------------------
@dataclass(frozen=True)
class UseCaseActions:
    request_key: bool
    decide: bool  # approve / reject a submitted use case
    suspend: bool
    reinstate: bool

    @property
    def any(self) -> bool:
        return self.request_key or self.decide or self.suspend or self.reinstate


def use_case_actions(user: AnyUser, use_case: UseCase) -> UseCaseActions:
    governs = can_govern(user)
    return UseCaseActions(
        request_key=use_case.status == UseCaseStatus.APPROVED and _is_member(user, use_case),
        decide=(
            governs
            and use_case.status == UseCaseStatus.SUBMITTED
            # no one decides their own submission (the services refuse it too)
            and use_case.status_changed_by_id != user.pk
        ),
        suspend=governs and use_case.status == UseCaseStatus.APPROVED,
        reinstate=governs and use_case.status == UseCaseStatus.SUSPENDED,
    )


@dataclass(frozen=True)
class KeyActions:
    reveal: bool
    decide: bool
    rotate: bool
    revoke: bool

    @property
    def any(self) -> bool:
        return self.reveal or self.decide or self.rotate or self.revoke


def key_successor(key: ApiKey) -> ApiKey | None:
    """The key that replaced this one by rotation, if any."""
    return ApiKey.objects.filter(rotated_from=key).first()


def key_actions(user: AnyUser, key: ApiKey) -> KeyActions:
    member = _is_member(user, key.use_case)
    live = key.status in (ApiKeyStatus.PENDING, ApiKeyStatus.APPROVED, ApiKeyStatus.ACTIVE)
    return KeyActions(
        reveal=(
            key.status == ApiKeyStatus.APPROVED
            and key.revealed_at is None
            and user.is_authenticated
            and key.requested_by_id == user.pk
        ),
        decide=(
            can_govern(user)
            and key.status == ApiKeyStatus.PENDING
            and key.requested_by_id != user.pk  # never one's own request
        ),
        rotate=(
            member
            and key.requested_by_id == user.pk  # rotating hands out the secret: owner only
            and key.status == ApiKeyStatus.ACTIVE
            and key_successor(key) is None
            and not key_expired(key)
        ),
        revoke=live and (member or can_govern(user)),
    )


def key_expired(key: ApiKey, now: datetime | None = None) -> bool:
    return key.expires_at is not None and key.expires_at <= (now or timezone.now())


def key_hint(key: ApiKey) -> str:
    """How a key is shown anywhere but its one reveal: its visible prefix and an ellipsis."""
    return f"{key.prefix or 'sk-sy-'}…"


# --- admission decisions: "why was request X refused at 14:02?" ----------------------------
DECISIONS_PER_PAGE = 50

# The reasons the gateway writes besides ``rate_limit:<limit name>`` (gateway/app.py).
DECISION_REASONS = {
    "max_concurrent_exceeded": "max concurrent requests exceeded",
    "queue_full": "queue full",
    "queue_timeout": "queue deadline passed",
}


def decision_reason_text(decision: str, reason: str) -> str:
    """A decision's reason in words: ``rate_limit:tenant acme tokens per minute`` reads
    "rate limit: tenant acme tokens per minute"; a queue wait names its priority class."""
    if not reason:
        return ""
    kind, sep, name = reason.partition(":")
    if sep:
        return f"{kind.replace('_', ' ')}: {name}"
    if decision == AdmissionDecision.Kind.QUEUED:
        return f"priority class: {reason}"
    return DECISION_REASONS.get(reason, reason.replace("_", " "))


def wait_text(milliseconds: int) -> str:
    if milliseconds < 1000:
        return f"{milliseconds} ms"
    return f"{milliseconds / 1000:.1f} s"


@dataclass(frozen=True)
class DecisionRow:
    """One decision as the page shows it; ``use_case`` only when it exists and is visible."""

    decision: AdmissionDecision
    reason_text: str
    wait_text: str
    use_case: UseCase | None
    audit_url: str | None


def admission_decisions_search(
    user: AnyUser,
    *,
    request_id: str = "",
    use_case_id: int | None = None,
    decision: str = "",
    occurred_from: datetime | None = None,
    occurred_to: datetime | None = None,
) -> QuerySet[AdmissionDecision]:
    """The person's decisions (the API's scope), filtered, newest first; ``occurred_to`` is
    exclusive, like the API's ``occurred_at__lt``."""
    rows = admission_decisions_visible(user)
    if request_id:
        rows = rows.filter(request_id=request_id)
    if use_case_id is not None:
        rows = rows.filter(use_case_id=use_case_id)
    if decision:
        rows = rows.filter(decision=decision)
    if occurred_from is not None:
        rows = rows.filter(occurred_at__gte=occurred_from)
    if occurred_to is not None:
        rows = rows.filter(occurred_at__lt=occurred_to)
    return rows.order_by("-occurred_at", "-id")


def decision_rows(user: AnyUser, decisions: Iterable[AdmissionDecision]) -> list[DecisionRow]:
    """Dress one page of decisions: reason in words, use case to link, audit summary's URL.

    The portal has no audit page, so the summary links to the API's audit event, which the
    same person may read (it carries the decision's tenant)."""
    decisions = list(decisions)
    ids = {row.use_case_id for row in decisions}
    use_cases = {
        uc.pk: uc for uc in use_cases_visible(user).filter(pk__in=ids).prefetch_related(None)
    }
    return [
        DecisionRow(
            decision=row,
            reason_text=decision_reason_text(row.decision, row.reason),
            wait_text=wait_text(row.queued_ms),
            use_case=use_cases.get(row.use_case_id),
            audit_url=(
                reverse("auditevent-detail", kwargs={"sequence": row.audit_sequence})
                if row.audit_sequence is not None
                else None
            ),
        )
        for row in decisions
    ]


FINDINGS_PER_PAGE = 50


def guardrail_findings_search(
    user: AnyUser,
    *,
    request_id: str = "",
    use_case_id: int | None = None,
    guardrail: str = "",
    action: str = "",
    occurred_from: datetime | None = None,
    occurred_to: datetime | None = None,
) -> QuerySet[GuardrailFinding]:
    """The person's findings (the API's scope), filtered, newest first."""
    rows = guardrail_findings_visible(user)
    if request_id:
        rows = rows.filter(request_id=request_id)
    if use_case_id is not None:
        rows = rows.filter(use_case_id=use_case_id)
    if guardrail:
        rows = rows.filter(guardrail=guardrail)
    if action:
        rows = rows.filter(action=action)
    if occurred_from is not None:
        rows = rows.filter(occurred_at__gte=occurred_from)
    if occurred_to is not None:
        rows = rows.filter(occurred_at__lt=occurred_to)
    return rows.order_by("-occurred_at", "-id")


def finding_counts(rows: QuerySet[GuardrailFinding]) -> list[dict[str, Any]]:
    """How many of ``rows`` each guardrail found, by action."""
    return list(
        rows.order_by()
        .values("guardrail", "action")
        .annotate(findings=Count("id"))
        .order_by("guardrail", "action")
    )


def use_case_finding_counts(use_case: UseCase) -> list[dict[str, Any]]:
    """A use case's findings by guardrail and action, from the hourly roll-up."""
    return list(
        GuardrailHour.objects.filter(use_case_id=use_case.pk)
        .values("guardrail", "action")
        .annotate(findings=Sum("findings"))
        .order_by("guardrail", "action")
    )


def model_notices(use_case: UseCase) -> list[Model]:
    """The models the use case may call that are deprecated or retired: the notice its
    owners see on its page (docs/models.md)."""
    return list(
        use_case.allowed_models.exclude(status=ModelStatus.ACTIVE)
        .select_related("successor")
        .order_by("sunset_at", "public_id")
    )
