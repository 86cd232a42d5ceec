"""How the gateway's checks reach what runs them: the guardrail service's client, and the
``FleetCaller`` through which a fleet-run check asks a model (gateway/guardrails/fleet.py).

Both go over the gateway's pooled fleet client (keep-alive, no new connection per check), and
both raise ``GuardrailUnavailable`` when a check cannot run: the use case's failure mode then
decides (gateway/guardrails/run.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from gateway import errors, model_routing
from gateway.errors import GatewayError
from gateway.policy import Principal
from gateway.policy_store import PolicyStore
from gateway.scheduling import Scheduler, Ticket, priority_class_for
from gateway.upstream import ReplicaUnreachable, Upstream, UpstreamError
from guardrails.protocol import (
    CHECK_BULK_PATH,
    CHECK_PATH,
    CheckSpec,
    encode_bulk_request,
    encode_request,
    over_budget_message,
    text_chars,
)

logger = logging.getLogger("gateway.guardrails")

_JSON = ((b"content-type", b"application/json"),)
# The most characters of text one bulk request carries, well inside the service's 16 MiB body
# bound even at 4 UTF-8 bytes a character (a gateway's own bodies are at most 10 MiB by
# default): a larger bulk goes as several requests at once.
BULK_REQUEST_CHARS = 2_000_000


class GuardrailUnavailable(Exception):
    """A check could not run; the message says why (never the text)."""


# --- the guardrail service's client ----------------------------------------------------------
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
        if self.max_text_chars is not None and text_chars(texts) > self.max_text_chars:
            # An answer over the budget (the request stage refused requests over it): it
            # cannot be checked, so the use case's failure mode decides.
            raise GuardrailUnavailable("the text is over the guardrail service's budget")
        return await self._post(CHECK_PATH, encode_request(stage, texts, checks), self._timeout_s)

    async def run_bulk(
        self, stage: str, bodies: Sequence[list[str]], checks: Sequence[CheckSpec]
    ) -> list[Any]:
        """``run`` for each of many bodies, in as few requests as the bodies fit (one, for
        any bulk a gateway accepts by default): each body's answer, or the
        ``GuardrailUnavailable`` that is its outcome (never raised)."""
        answers: list[Any] = [None] * len(bodies)
        chunks: list[list[int]] = []
        chars = 0
        for index, texts in enumerate(bodies):
            size = text_chars(texts)
            if self.max_text_chars is not None and size > self.max_text_chars:
                answers[index] = GuardrailUnavailable(
                    "the text is over the guardrail service's budget"
                )
                continue
            if not chunks or chars + size > BULK_REQUEST_CHARS:
                chunks.append([])
                chars = 0
            chunks[-1].append(index)
            chars += size
        results = await asyncio.gather(
            *(self._bulk(stage, [bodies[i] for i in chunk], checks) for chunk in chunks)
        )
        for chunk, found in zip(chunks, results, strict=True):
            for index, answer in zip(chunk, found, strict=True):
                answers[index] = answer
        return answers

    async def _bulk(
        self, stage: str, bodies: list[list[str]], checks: Sequence[CheckSpec]
    ) -> list[Any]:
        # Never sooner to give up than checking the bodies in turn would be.
        timeout_s = self._timeout_s * len(bodies)
        try:
            answer = await self._post(
                CHECK_BULK_PATH, encode_bulk_request(stage, bodies, checks), timeout_s
            )
            results = answer["results"] if isinstance(answer, dict) else None
            if not isinstance(results, list) or len(results) != len(bodies):
                raise GuardrailUnavailable("the guardrail service answered a malformed bulk")
        except GuardrailUnavailable as exc:
            return [exc] * len(bodies)
        return [_bulk_answer(result) for result in results]

    async def _post(self, path: str, body: bytes, timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._upstream.post(self._url, path, body, self._headers)
                try:
                    parts = []
                    while chunk := await response.read():
                        parts.append(chunk)
                finally:
                    response.close()
        except TimeoutError:
            raise GuardrailUnavailable(
                f"the guardrail service did not answer within {timeout_s:g}s"
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


def _bulk_answer(result: Any) -> Any:
    """One body's part of a bulk answer: its outcome, or its failure as an exception."""
    if not isinstance(result, dict):
        return GuardrailUnavailable("the guardrail service answered a malformed bulk")
    error = result.get("error")
    if error is not None:
        code = error.get("code", "error") if isinstance(error, dict) else "error"
        return GuardrailUnavailable(f"the guardrail service could not check a body ({code})")
    return result


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
        policy = self._policy.current()
        found = model_routing.named(policy, model)
        if found is None:
            raise GuardrailUnavailable(f"the guard model {model!r} is not in the policy")
        if found.routing is not None:  # a guard model with versions: its split decides
            try:
                found = model_routing.route(policy, found, 0)
            except GatewayError as exc:
                raise GuardrailUnavailable(f"the guard model {model!r}: {exc}") from None
        service_class = policy.priority_classes.get(priority_class) or priority_class_for(
            policy, _NOBODY
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


# A principal of no class: what an unknown ``priority_class`` is served as. Frozen, so one
# serves every call.
_NOBODY = Principal(
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
