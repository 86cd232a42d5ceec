"""Running a stage's guardrails for a door: where a request's texts are, every check of the
stage in order, and what is recorded of each finding.

Worker-run checks of a stage go to the guardrail service in one call (guardrails/service.py;
detectors are CPU-bound and never run on the gateway's event loop). Fleet-run ones (a guard
model, an embedding model) go through ``gateway.guardrails.fleet.run_fleet_check`` with a
``FleetCaller`` that takes capacity on that model through the scheduler like any request
(gateway/guardrails/client.py). Within a stage the service's checks run first, in the use
case's order, then the fleet's.

When a check cannot run (the service unreachable, too slow, failing) the use case's
``guardrail_failure`` decides: "closed" refuses with 503 ``guardrail_unavailable``, "open"
goes on; both are recorded (``failed_closed`` / ``failed_open``). Every finding goes to the
``sy:guardrails`` stream (entity types and counts, never the text) and to
``switchyard_gateway_guardrail_findings_total``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from gateway import errors
from gateway.accounting import Accounting
from gateway.errors import GatewayError
from gateway.guardrail_plan import ScopedChecks, StageChecks
from gateway.guardrails.client import FleetCaller, GuardrailUnavailable, ServiceClient
from gateway.guardrails.fleet import run_fleet_check
from gateway.policy import Model, Principal
from gateway.policy_store import PolicyStore
from gateway.scheduling import Scheduler
from gateway.settings import GuardrailClientSettings
from gateway.upstream import Upstream
from guardrails import texts
from guardrails.engine import Check
from guardrails.protocol import CheckSpec
from guardrails.texts import Slot

logger = logging.getLogger("gateway.guardrails")

# Bodies of one bulk whose fleet checks run at once: each holds a guard model's capacity.
FLEET_CONCURRENCY = 32


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


async def _fleet_check(
    fleet: FleetCaller, check: Check, stage: str, texts: list[str], document: Any
) -> dict[str, Any]:
    """A fleet-run guardrail (gateway/guardrails/fleet.py), in the service's answer shape:
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
    """What a record needs of the request being checked (gateway/call.py's ``Call``)."""

    request_id: str
    record_id: str
    principal: Principal
    model: Model


class Body(NamedTuple):
    """One of many bodies checked together (``Guardrails.run_many``): its texts, the document
    they come from, and who said each (None: unknown)."""

    texts: list[str]
    document: Any
    roles: Sequence[str] | None


@dataclass(slots=True)
class StageResult:
    texts: list[str]
    findings: list[dict[str, Any]] = field(default_factory=list)
    blocked: dict[str, Any] | None = None
    failed: list[str] = field(default_factory=list)  # guardrails that could not run


def _scoped_at(group: ScopedChecks, result: StageResult, roles: Sequence[str] | None) -> list[int]:
    """Which of the texts a scoped group reads: those its roles said."""
    if roles is None or len(roles) != len(result.texts):
        return list(range(len(result.texts)))  # roles unknown: read everything, fail safe
    return [i for i, role in enumerate(roles) if role in group.roles]


def _merge_part(result: StageResult, at: Sequence[int], part: StageResult) -> None:
    """A scoped group's outcome on some of the texts: its redactions go back in place."""
    for i, text in zip(at, part.texts, strict=True):
        result.texts[i] = text
    result.findings += part.findings
    result.failed += [name for name in part.failed if name not in result.failed]
    if part.blocked is not None:
        result.blocked = part.blocked


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

    @classmethod
    def connect(
        cls,
        settings: GuardrailClientSettings,
        *,
        upstream: Upstream,
        policy: PolicyStore,
        scheduler: Scheduler,
        metrics: GuardrailMetrics,
        accounting: Accounting,
    ) -> Guardrails:
        """The checks of a process that answers doors (the gateway, the batcher): the service
        over its pooled fleet client, with its token and text budget, and the fleet seam."""
        service = ServiceClient(
            upstream,
            settings.url,
            settings.timeout_s,
            token=settings.token,
            max_text_chars=settings.max_text_chars,
        )
        return cls(
            service=service,
            fleet=FleetCaller(policy, scheduler, upstream),
            metrics=metrics,
            accounting=accounting,
            retry_after_s=settings.retry_after_s,
        )

    async def run(
        self,
        checks: StageChecks,
        texts: list[str],
        document: Any,
        roles: Sequence[str] | None = None,
    ) -> StageResult:
        """Every check of the stage; a block stops the run. Never raises for a check that
        cannot run: it is listed in ``failed`` for the caller's failure mode. ``roles``: who
        said each text (guardrails/texts.py); checks scoped to some roles read only theirs."""
        started = time.monotonic()
        result = StageResult(list(texts))
        try:
            await self._run_checks(checks.stage, checks.service, checks.fleet, result, document)
            for group in checks.scoped:
                if result.blocked is not None:
                    break
                at = _scoped_at(group, result, roles)
                if not at:
                    continue
                part = StageResult([result.texts[i] for i in at])
                await self._run_checks(checks.stage, group.service, group.fleet, part, document)
                _merge_part(result, at, part)
        finally:
            self._metrics.guardrail_checked(checks.stage, time.monotonic() - started)
        return result

    async def run_many(self, checks: StageChecks, bodies: Sequence[Body]) -> list[StageResult]:
        """``run`` for each of many bodies (an async bulk submit's), each answered exactly as
        alone, but every service check of the stage sent once for all of them (one batch the
        service's workers share out: guardrails/batching.py) and the fleet's checks run for
        the bodies concurrently, not in turn."""
        if not bodies:
            return []
        started = time.monotonic()
        results = [StageResult(list(body.texts)) for body in bodies]
        documents = [body.document for body in bodies]
        try:
            await self._run_many_checks(
                checks.stage, checks.service, checks.fleet, results, documents
            )
            for group in checks.scoped:
                picks = [
                    (index, at)
                    for index, result in enumerate(results)
                    if result.blocked is None
                    and (at := _scoped_at(group, result, bodies[index].roles))
                ]
                if not picks:
                    continue
                parts = [StageResult([results[i].texts[j] for j in at]) for i, at in picks]
                await self._run_many_checks(
                    checks.stage,
                    group.service,
                    group.fleet,
                    parts,
                    [documents[i] for i, _ in picks],
                )
                for (index, at), part in zip(picks, parts, strict=True):
                    _merge_part(results[index], at, part)
        finally:
            self._metrics.guardrail_checked(checks.stage, time.monotonic() - started)
        return results

    async def _run_checks(
        self,
        stage: str,
        service: Sequence[CheckSpec],
        fleet: Sequence[Check],
        result: StageResult,
        document: Any,
    ) -> None:
        if service and any(result.texts):
            try:
                outcome = await self.service.run(stage, result.texts, service)
            except GuardrailUnavailable as exc:
                logger.warning("guardrail_unavailable stage=%s reason=%s", stage, exc)
                result.failed += [c.guardrail for c in service]
            else:
                self._merge(result, outcome)
        if fleet:
            await self._run_fleet(stage, fleet, result, document)

    async def _run_many_checks(
        self,
        stage: str,
        service: Sequence[CheckSpec],
        fleet: Sequence[Check],
        results: list[StageResult],
        documents: Sequence[Any],
    ) -> None:
        """``_run_checks`` for many bodies: the service's checks in one bulk call."""
        sending = [index for index, result in enumerate(results) if any(result.texts)]
        if service and sending:
            outcomes = await self.service.run_bulk(
                stage, [results[index].texts for index in sending], service
            )
            failed = [outcome for outcome in outcomes if isinstance(outcome, GuardrailUnavailable)]
            for index, outcome in zip(sending, outcomes, strict=True):
                if isinstance(outcome, GuardrailUnavailable):
                    results[index].failed += [c.guardrail for c in service]
                else:
                    self._merge(results[index], outcome)
            if failed:  # one line for the bulk, not one a body
                logger.warning(
                    "guardrail_unavailable stage=%s bodies=%d reason=%s",
                    stage,
                    len(failed),
                    failed[0],
                )
        if fleet:
            # Bounded: each body's fleet checks take capacity on a guard model's replicas.
            lanes = asyncio.Semaphore(FLEET_CONCURRENCY)

            async def one(result: StageResult, document: Any) -> None:
                async with lanes:
                    await self._run_fleet(stage, fleet, result, document)

            await asyncio.gather(*map(one, results, documents))

    async def _run_fleet(
        self, stage: str, fleet: Sequence[Check], result: StageResult, document: Any
    ) -> None:
        for check in fleet:
            if result.blocked is not None:
                break
            try:
                outcome = await _fleet_check(self.fleet, check, stage, result.texts, document)
            except Exception as exc:  # whatever stops a check, the failure mode decides
                logger.warning(
                    "guardrail_unavailable stage=%s guardrail=%s reason=%r",
                    stage,
                    check.guardrail,
                    exc,
                )
                result.failed.append(check.guardrail)
            else:
                self._merge(result, outcome)

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
