"""Guardrails on the request path: which checks a use case runs at each stage, the client of
the guardrail service, the fleet seam, and what is recorded of each finding.

At snapshot parse time each use case's selections become a ``GuardPlan`` (request-stage and
response-stage checks, each split into the ones the guardrail service runs and the ones a
model on the fleet answers); only use cases with selections get one, so the request path of
one without pays a single dictionary lookup (``Policy.guarded``).

Worker-run checks of a stage go to the guardrail service in one call (guardrails/service.py;
detectors are CPU-bound and never run on the gateway's event loop). Fleet-run ones (a guard
model, an embedding model) go through ``gateway.guardrail_fleet.run_fleet_check`` with a
``FleetCaller`` that takes capacity on that model through the scheduler like any request.
Within a stage the service's checks run first, in the use case's order, then the fleet's.

When a check cannot run (the service unreachable, too slow, failing) the use case's
``guardrail_failure`` decides: "closed" refuses with 503 ``guardrail_unavailable``, "open"
goes on; both are recorded (``failed_closed`` / ``failed_open``). Every finding goes to the
``sy:guardrails`` stream (entity types and counts, never the text) and to
``switchyard_gateway_guardrail_findings_total``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway import errors
from gateway.errors import GatewayError
from gateway.guardrail_fleet import run_fleet_check
from guardrails import texts
from guardrails.catalogue import entries
from guardrails.engine import Check
from guardrails.protocol import (
    CHECK_PATH,
    CheckSpec,
    encode_request,
    over_budget_message,
    text_chars,
)
from guardrails.texts import Slot

if TYPE_CHECKING:
    from gateway.accounting import Accounting
    from gateway.policy import Guardrail, Model, Principal
    from gateway.policy_store import PolicyStore
    from gateway.scheduling import Scheduler
    from gateway.upstream import Upstream

logger = logging.getLogger("gateway.guardrails")

FAILURE_MODES = ("closed", "open")
_SIDES = {"request": ("request",), "response": ("response",), "both": ("request", "response")}
_ACTIONS = frozenset({"block", "redact", "flag"})
_JSON = ((b"content-type", b"application/json"),)

# How much of a streamed answer a check needs to see at once (characters): a span detector
# needs its longest entity, a classifier a sentence or two. A stream holds back the largest
# of its checks' needs (a guardrail not listed: DEFAULT_WINDOW_CHARS).
WINDOW_CHARS: Mapping[str, int] = {
    "pii": 128,
    "secrets": 256,
    "invisible_text": 16,
    "banned_substrings": 128,
    "toxicity": 256,
    "language": 256,
    "banned_topics": 512,
    "groundedness": 512,
}
DEFAULT_WINDOW_CHARS = 256


# --- the plan, made at snapshot parse time ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageChecks:
    stage: str
    service: tuple[CheckSpec, ...]  # run by the guardrail service, in one call
    fleet: tuple[Check, ...]  # answered by a model on the fleet, one call each

    @property
    def names(self) -> list[str]:
        return [c.guardrail for c in self.service] + [c.guardrail for c in self.fleet]


@dataclass(frozen=True, slots=True)
class GuardPlan:
    request: StageChecks | None
    response: StageChecks | None
    failure: str  # "closed" | "open"
    window_chars: int  # what a stream's response checks hold back


def plan_guardrails(selections: Sequence[Guardrail], failure: str) -> GuardPlan:
    """A use case's selections split by stage and by where they run; ValueError if malformed."""
    if failure not in FAILURE_MODES:
        raise ValueError(f"guardrail_failure must be closed or open, not {failure!r}")
    try:
        catalogue = entries()
    except (ImportError, AttributeError, ValueError) as exc:
        # A bad SWITCHYARD_GUARDRAIL_DETECTORS on this host must not stop the gateway: the
        # built-in entries say which run on the fleet; the rest go to the service.
        logger.error("guardrail_catalogue_unavailable error=%r", exc)
        catalogue = {}
    staged: dict[str, tuple[list[CheckSpec], list[Check]]] = {
        "request": ([], []),
        "response": ([], []),
    }
    for selection in selections:
        stages = _SIDES.get(selection.side)
        if stages is None or selection.action not in _ACTIONS:
            raise ValueError(
                f"guardrail {selection.guardrail!r}: side {selection.side!r} / action "
                f"{selection.action!r} is not valid"
            )
        entry = catalogue.get(selection.guardrail)
        for stage in stages:
            service, fleet = staged[stage]
            if entry is not None and entry.runs_on == "fleet":
                fleet.append(Check(selection.guardrail, selection.action, selection.config))
            else:
                service.append(
                    CheckSpec(selection.guardrail, selection.action, dict(selection.config))
                )

    def stage_checks(stage: str) -> StageChecks | None:
        service, fleet = staged[stage]
        if not service and not fleet:
            return None
        return StageChecks(stage, tuple(service), tuple(fleet))

    response = stage_checks("response")
    window = (
        max(
            (WINDOW_CHARS.get(name, DEFAULT_WINDOW_CHARS) for name in response.names),
            default=DEFAULT_WINDOW_CHARS,
        )
        if response
        else DEFAULT_WINDOW_CHARS
    )
    return GuardPlan(stage_checks("request"), response, failure, window)


# --- where the texts are --------------------------------------------------------------------
def request_slots(path: str, document: Mapping[str, Any]) -> list[Slot]:
    """The texts of a request the model reads (guardrails/texts.py, the one reading every
    stage shares); run only for a use case with request guardrails, which cannot pass what
    they cannot read: token ids, prompt embeddings, an unknown part are refused (400)."""
    try:
        return texts.request_slots(path, document)
    except texts.Unreadable as exc:
        raise errors.bad_request(
            f"This use case's request guardrails cannot read {exc.param} ({exc.what}) as "
            "text, so the request is refused: send what the model is to read as text.",
            param=exc.param,
            code="unreadable_content",
        ) from None


# --- the guardrail service's client ----------------------------------------------------------
class GuardrailUnavailable(Exception):
    """A check could not run; the message says why (never the text)."""


class ServiceClient:
    """Calls the guardrail service over the gateway's pooled fleet client (keep-alive, no
    new connection per check)."""

    def __init__(
        self,
        upstream: Upstream,
        url: str,
        timeout_s: float,
        *,
        token: str = "",
        max_text_chars: int | None = None,
    ) -> None:
        self._upstream = upstream
        self._url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._headers: tuple[tuple[bytes, bytes], ...] = _JSON
        if token:
            self._headers += ((b"authorization", b"Bearer " + token.encode()),)
        self.max_text_chars = max_text_chars

    def over_budget(self, texts: Sequence[str]) -> GatewayError | None:
        """The 400 for texts over the service's budget, or None: the request stage refuses
        them before sending, whatever the use case's failure mode (a client error, not the
        service's), so no client can time out, kill and reload the service's workers."""
        if self.max_text_chars is None:
            return None
        chars = text_chars(texts)
        if chars <= self.max_text_chars:
            return None
        return errors.bad_request(
            over_budget_message(chars, self.max_text_chars), code="guardrail_text_too_large"
        )

    async def run(self, stage: str, texts: list[str], checks: Sequence[CheckSpec]) -> Any:
        from gateway.upstream import UpstreamError

        if self.max_text_chars is not None and text_chars(texts) > self.max_text_chars:
            # An answer over the budget (the request stage refused requests over it): it
            # cannot be checked, so the use case's failure mode decides.
            raise GuardrailUnavailable("the text is over the guardrail service's budget")
        body = encode_request(stage, texts, checks)
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._upstream.post(self._url, CHECK_PATH, body, self._headers)
                try:
                    parts = []
                    while chunk := await response.read():
                        parts.append(chunk)
                finally:
                    response.close()
        except TimeoutError:
            raise GuardrailUnavailable(
                f"the guardrail service did not answer within {self._timeout_s:g}s"
            ) from None
        except (UpstreamError, OSError) as exc:
            raise GuardrailUnavailable(
                f"the guardrail service is unreachable ({exc.__class__.__name__})"
            ) from None
        raw = b"".join(parts)
        if response.status != 200:
            code = _error_code(raw)
            if response.status == 400:
                # A selection the service refuses: a policy problem, not a passing failure.
                logger.error("guardrail_check_refused code=%s body=%s", code, raw[:500])
            raise GuardrailUnavailable(f"the guardrail service answered {response.status} {code}")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise GuardrailUnavailable("the guardrail service answered malformed JSON") from None


def _error_code(raw: bytes) -> str:
    try:
        return str(orjson.loads(raw)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "error"


# --- the fleet seam --------------------------------------------------------------------------
class FleetCaller:
    """How a fleet-run guardrail asks a model: capacity through the scheduler (a grant like
    any other, without rate limits: the guardrail's calls are not the caller's), then a POST
    over the gateway's fleet client to the granted replica; released after."""

    def __init__(self, policy: PolicyStore, scheduler: Scheduler, upstream: Upstream) -> None:
        self._policy = policy
        self._scheduler = scheduler
        self._upstream = upstream

    async def post_json(
        self, model: str, path: str, body: dict[str, Any], *, priority_class: str
    ) -> dict[str, Any]:
        from gateway.scheduling import Ticket, priority_class_for
        from gateway.upstream import ReplicaUnreachable, UpstreamError

        policy = self._policy.current()
        found = policy.models.get(model)
        if found is None:
            raise GuardrailUnavailable(f"the guard model {model!r} is not in the policy")
        service_class = policy.priority_classes.get(priority_class) or priority_class_for(
            policy, _nobody()
        )
        ticket = Ticket(
            request_id=f"guardrail-{secrets.token_hex(6)}",
            model=found.public_id,
            replicas=tuple((url, found.max_in_flight_per_replica) for url in found.replicas),
            rank=service_class.rank,
            priority_class=service_class.name,
            queue_timeout_s=max(service_class.queue_timeout_s, 0.001),
            max_queue_length=service_class.max_queue_length,
            tenant="switchyard-guardrails",
            use_case_id="guardrails",
            vllm_priority=service_class.vllm_priority,
            pool_share=service_class.pool_share_permille,
        )
        grant = await self._scheduler.acquire(ticket)
        served = False
        try:
            payload = {**body, "model": found.served_name_for(grant.replica)}
            payload["priority"] = grant.vllm_priority
            async with asyncio.timeout(found.timeout_s):
                response = await self._upstream.post(
                    grant.replica, path, orjson.dumps(payload), _JSON
                )
                served = True
                try:
                    parts = []
                    while chunk := await response.read():
                        parts.append(chunk)
                finally:
                    response.close()
        except ReplicaUnreachable:
            raise GuardrailUnavailable(f"no replica of {model!r} could be reached") from None
        except (UpstreamError, TimeoutError) as exc:
            raise GuardrailUnavailable(f"{model!r} failed ({exc.__class__.__name__})") from None
        finally:
            if served:
                await self._scheduler.release(grant)
            else:
                await self._scheduler.release_unused(grant)
        if response.status != 200:
            raise GuardrailUnavailable(f"{model!r} answered {response.status}")
        answer: dict[str, Any] = orjson.loads(b"".join(parts))
        return answer


def _nobody() -> Principal:
    """A principal of no class: what an unknown ``priority_class`` is served as."""
    from gateway.policy import Principal

    return Principal(
        key_id=None,
        key_prefix="guardrails",
        tenant="switchyard-guardrails",
        tenant_id=0,
        environment="",
        use_case="guardrails",
        use_case_id=0,
        namespace="",
        models=frozenset(),
        expires_at=None,
    )


async def _fleet_check(
    fleet: FleetCaller, check: Check, stage: str, texts: list[str], document: Any
) -> dict[str, Any]:
    """A fleet-run guardrail (gateway/guardrail_fleet.py), in the service's answer shape:
    its findings, and the first of them that blocks. Fleet checks never redact."""
    summaries = await run_fleet_check(fleet, check, stage, texts, document)
    findings = [
        {"guardrail": s.guardrail, "action": s.action, "entities": s.entities, "score": s.score}
        for s in summaries
    ]
    blocked = next((f for f in findings if f["action"] == "blocked"), None)
    return {"findings": findings, "blocked": blocked}


# --- running a stage -------------------------------------------------------------------------
class GuardrailMetrics(Protocol):
    """What the checks report to their process's metrics (the gateway's, or the batcher's
    when it checks async answers)."""

    def guardrail_checked(self, stage: str, seconds: float) -> None: ...

    def guardrail_found(self, *, guardrail: str, stage: str, action: str) -> None: ...


class Subject(Protocol):
    """What a record needs of the request being checked (gateway/app.py's ``Call``)."""

    request_id: str
    record_id: str
    principal: Principal
    model: Model


@dataclass(slots=True)
class StageResult:
    texts: list[str]
    findings: list[dict[str, Any]] = field(default_factory=list)
    blocked: dict[str, Any] | None = None
    failed: list[str] = field(default_factory=list)  # guardrails that could not run


class Guardrails:
    """Runs a stage's checks for the request path, and records what they found."""

    def __init__(
        self,
        *,
        service: ServiceClient,
        fleet: FleetCaller,
        metrics: GuardrailMetrics,
        accounting: Accounting,
        retry_after_s: int,
    ) -> None:
        self.service = service
        self.fleet = fleet
        self._metrics = metrics
        self._accounting = accounting
        self._retry_after_s = retry_after_s

    async def run(self, checks: StageChecks, texts: list[str], document: Any) -> StageResult:
        """Every check of the stage; a block stops the run. Never raises for a check that
        cannot run: it is listed in ``failed`` for the caller's failure mode."""
        started = time.monotonic()
        result = StageResult(list(texts))
        try:
            if checks.service and any(result.texts):
                try:
                    outcome = await self.service.run(checks.stage, result.texts, checks.service)
                except GuardrailUnavailable as exc:
                    logger.warning("guardrail_unavailable stage=%s reason=%s", checks.stage, exc)
                    result.failed += [c.guardrail for c in checks.service]
                else:
                    self._merge(result, outcome)
            for check in checks.fleet:
                if result.blocked is not None:
                    break
                try:
                    outcome = await _fleet_check(
                        self.fleet, check, checks.stage, result.texts, document
                    )
                except Exception as exc:  # whatever stops a check, the failure mode decides
                    logger.warning(
                        "guardrail_unavailable stage=%s guardrail=%s reason=%r",
                        checks.stage,
                        check.guardrail,
                        exc,
                    )
                    result.failed.append(check.guardrail)
                else:
                    self._merge(result, outcome)
        finally:
            self._metrics.guardrail_checked(checks.stage, time.monotonic() - started)
        return result

    @staticmethod
    def _merge(result: StageResult, outcome: Any) -> None:
        texts = outcome.get("texts")
        if isinstance(texts, list) and len(texts) == len(result.texts):
            result.texts = [str(text) for text in texts]
        result.findings += list(outcome.get("findings") or ())
        if outcome.get("blocked"):
            result.blocked = outcome["blocked"]

    def unavailable(self, stage: str, failed: Sequence[str]) -> GatewayError:
        return errors.service_unavailable(
            f"The {stage} guardrails ({', '.join(failed)}) could not run; retry shortly.",
            code="guardrail_unavailable",
            retry_after_s=self._retry_after_s,
        )

    def record(
        self,
        subject: Subject,
        *,
        stage: str,
        findings: Sequence[Mapping[str, Any]],
        failed: Sequence[str],
        failure: str,
        policy_version: int | None,
    ) -> None:
        """Each finding and each failure: one stream entry and one counter increment."""
        failed_action = "failed_open" if failure == "open" else "failed_closed"
        rows = [
            (f["guardrail"], f["action"], f.get("entities") or {}, f.get("score") or 0.0)
            for f in findings
        ] + [(name, failed_action, {}, 0.0) for name in failed]
        for guardrail, action, entities, score in rows:
            self._metrics.guardrail_found(guardrail=guardrail, stage=stage, action=action)
            self._accounting.record_guardrail(
                request_id=subject.request_id,
                tenant=subject.principal.tenant,
                use_case_id=subject.principal.use_case_id,
                key_id=subject.principal.key_id,
                model=subject.model.public_id,
                stage=stage,
                guardrail=guardrail,
                action=action,
                entities=entities,
                score=score,
                policy_version=policy_version,
                record_id=subject.record_id,
            )


def blocked_message(blocked: Mapping[str, Any], stage: str) -> str:
    entities = ", ".join(sorted(blocked.get("entities") or {}))
    found = f" ({entities})" if entities else ""
    what = "request" if stage == "request" else "response"
    return f"The {what} was blocked by the '{blocked['guardrail']}' guardrail{found}."


def merge_findings(findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (guardrail, action): what a stream's windows found, added up."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for finding in findings:
        key = (finding["guardrail"], finding["action"])
        into = merged.setdefault(
            key, {"guardrail": key[0], "action": key[1], "entities": {}, "score": 0.0}
        )
        for entity, count in (finding.get("entities") or {}).items():
            into["entities"][entity] = into["entities"].get(entity, 0) + int(count)
        into["score"] = max(into["score"], float(finding.get("score") or 0.0))
    return list(merged.values())
