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

from gateway import errors
from gateway.errors import GatewayError
from gateway.policy import Principal
from gateway.policy_store import PolicyStore
from gateway.scheduling import Scheduler, Ticket, priority_class_for
from gateway.upstream import ReplicaUnreachable, Upstream, UpstreamError
from guardrails.protocol import (
    CHECK_PATH,
    CheckSpec,
    encode_request,
    over_budget_message,
    text_chars,
)

logger = logging.getLogger("gateway.guardrails")

_JSON = ((b"content-type", b"application/json"),)


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
        policy = self._policy.current()
        found = policy.models.get(model)
        if found is None:
            raise GuardrailUnavailable(f"the guard model {model!r} is not in the policy")
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
