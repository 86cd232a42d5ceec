"""Fleet-run guardrails: checks that ask a model the fleet serves, awaited by the gateway.

Banned topics asks a guard model (Llama Guard's format) one chat completion per judged text;
groundedness asks an embedding model for the answer's claims and the request's context in one
call. Neither runs in the guardrail workers: the work is the model's, and the gateway only
awaits I/O through a ``FleetCaller`` (the gateway's implements it on its scheduler and fleet
client, so guard calls take replica capacity like any request). The little arithmetic that
remains (a similarity matrix) runs in a thread, off the event loop.

Groundedness by logprobs (``method`` "logprobs" or "both") asks no model: it reads the
answer's own token logprobs (guardrails/confidence.py), which the response stage hands over
with the request as an ``Answered`` document. The gateway asks the model for them only for
use cases whose plan says so (``GuardPlan.logprobs``: ``ask_logprobs`` adds one member to the
body at the grant) and takes them out of the answer again unless the client asked too.

Anything that keeps a check from giving an answer (the model missing or failing, no answer
in ``timeout_s``, an answer that is not a verdict or not vectors) raises ``FleetCheckFailed``,
which the gateway maps to the use case's failure mode.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from guardrails import confidence
from guardrails.base import Finding, SettingsError
from guardrails.engine import Check, Summary
from guardrails.grounding import GroundednessCheck
from guardrails.judge import GuardModelJudge, VerdictError
from runtime.http import with_member

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
_PAST = {"block": "blocked", "flag": "flagged"}

_judge = GuardModelJudge()
_grounding = GroundednessCheck()


class FleetCaller(Protocol):
    """Posts a JSON body to a model the fleet serves and returns its JSON answer; raises for
    anything but a 200 (the message says why, never the body)."""

    async def post_json(
        self, model: str, path: str, body: dict[str, Any], *, priority_class: str
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Answered:
    """What a response check reads beside the answer's texts: the request, and the answer's
    token logprobs — ``tokens`` by choice index as a stream collected them (None: missing),
    or the whole parsed ``answer`` to read them from (off the event loop: a long answer's
    logprobs are thousands of entries)."""

    request: object
    tokens: Mapping[int, Sequence[confidence.Token]] | None = None
    answer: object = None


def _logprobs_member(path: str, document: Mapping[str, Any]) -> bool | int | None:
    """The ``logprobs`` value to forward so that the answer carries its token logprobs
    (chat ``true``; completions ``0``, the sampled token's alone), or None to leave the body
    as it is: the client asked itself, or a chat request names ``top_logprobs`` without
    ``logprobs`` (vLLM refuses it, and so it must still be)."""
    if confidence.client_asked(path, document):
        return None
    chat = path == confidence.CHAT_PATH
    if chat and document.get("top_logprobs"):
        return None
    return True if chat else 0


def ask_logprobs(path: str, body: bytes, document: Mapping[str, Any]) -> bytes:
    """The upstream body asking for the answer's token logprobs (``_logprobs_member``).
    Spliced in as the body's last member; a ``logprobs`` the client set false or null is
    replaced (one serialisation, on that rare path)."""
    value = _logprobs_member(path, document)
    if value is None:
        return body
    if "logprobs" in document:
        forwarded = orjson.loads(body)
        forwarded["logprobs"] = value
        return orjson.dumps(forwarded)
    return with_member(body, b'"logprobs":true' if value is True else b'"logprobs":0')


def ask_logprobs_document(path: str, document: dict[str, Any]) -> dict[str, Any]:
    """``ask_logprobs`` for a body still being built (the batcher's upstream document)."""
    value = _logprobs_member(path, document)
    return document if value is None else {**document, "logprobs": value}


class FleetCheckFailed(Exception):
    """A fleet-run guardrail could not run. The message names the guardrail and the reason,
    never the text being checked."""


async def run_fleet_check(
    fleet: FleetCaller, check: Check, stage: str, texts: Sequence[str], document: object
) -> list[Summary]:
    """What ``check`` finds in ``texts`` at ``stage`` ("request": the request's texts;
    "response": each choice's answer text), ``document`` being the request body (roles,
    context). One ``Summary`` if it found anything, else none."""
    answered = None
    if isinstance(document, Answered):
        answered = document
        document = document.request
    action = _PAST.get(check.action)
    if action is None:
        raise FleetCheckFailed(f"{check.guardrail} cannot {check.action}; only block or flag.")
    try:
        if check.guardrail == _judge.name:
            settings = _judge.validate(check.settings)
            findings = await _banned_topics(fleet, settings, stage, texts, document)
        elif check.guardrail == _grounding.name:
            settings = _grounding.validate(check.settings)
            findings = await _groundedness(fleet, settings, stage, texts, document, answered)
        else:
            raise FleetCheckFailed(f"{check.guardrail!r} is not a fleet-run guardrail.")
    except SettingsError as exc:
        raise FleetCheckFailed(f"{check.guardrail} has unusable settings: {exc}") from None
    except FleetCheckFailed as exc:
        raise FleetCheckFailed(f"{check.guardrail} could not run: {exc}") from None
    if not findings:
        return []
    return [
        Summary(
            guardrail=check.guardrail,
            action=action,
            entities=dict(Counter(f.entity for f in findings)),
            score=max(f.score for f in findings),
        )
    ]


async def _ask(
    fleet: FleetCaller, settings: Mapping[str, Any], path: str, body: dict[str, Any]
) -> dict[str, Any]:
    model, timeout = settings["model"], settings["timeout_s"]
    try:
        async with asyncio.timeout(timeout):
            return await fleet.post_json(
                model, path, body, priority_class=settings["priority_class"]
            )
    except TimeoutError:
        raise FleetCheckFailed(f"{model!r} did not answer within {timeout:g} s") from None
    except Exception as exc:  # whatever the caller raises: the model could not be asked
        raise FleetCheckFailed(f"asking {model!r}: {exc or type(exc).__name__}") from None


# --- banned topics -------------------------------------------------------------------------
async def _banned_topics(
    fleet: FleetCaller,
    settings: Mapping[str, Any],
    stage: str,
    texts: Sequence[str],
    document: object,
) -> list[Finding]:
    if stage == "request":
        # The whole request in one question: the texts say who said what, through document.
        judged = [list(texts)] if any(t.strip() for t in texts) else []
    else:
        judged = [[text] for text in texts if text.strip()]  # each choice its own answer
    answers = await asyncio.gather(
        *(
            _ask(
                fleet,
                settings,
                CHAT_PATH,
                _judge.request_body(stage, j, settings, document=document),
            )
            for j in judged
        )
    )
    findings: list[Finding] = []
    for answer in answers:
        try:
            findings += _judge.findings(_message_content(answer), settings)
        except VerdictError as exc:
            raise FleetCheckFailed(str(exc)) from None
    return findings


def _message_content(answer: Mapping[str, Any]) -> str:
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise FleetCheckFailed("the guard model's answer has no message") from None
    if not isinstance(content, str):
        raise FleetCheckFailed("the guard model's answer has no text")
    return content


# --- groundedness --------------------------------------------------------------------------
async def _groundedness(
    fleet: FleetCaller,
    settings: Mapping[str, Any],
    stage: str,
    texts: Sequence[str],
    document: object,
    answered: Answered | None = None,
) -> list[Finding]:
    if stage != "response":
        raise FleetCheckFailed("groundedness checks responses only")
    method = settings["method"]
    found: list[Finding] = []
    if method in ("logprobs", "both"):
        low = (
            None
            if answered is None
            else await asyncio.to_thread(_low_confidence, answered, settings)
        )
        if low is None:
            raise FleetCheckFailed("the answer carries no token logprobs")
        found = low
    if method in ("embedding", "both"):
        found += await _by_embedding(fleet, settings, texts, document)
    return found


def _low_confidence(answered: Answered, settings: Mapping[str, Any]) -> list[Finding] | None:
    """One ``low_confidence`` finding per span of unsure tokens, in any choice; None when
    the answer carries no logprobs."""
    tokens = answered.tokens
    if tokens is None and answered.answer is not None:
        tokens = confidence.answer_tokens(answered.answer)
    if tokens is None:
        return None
    return [
        span.finding()
        for choice in tokens.values()
        for span in confidence.spans(choice, settings["min_logprob"], settings["min_span_tokens"])
    ]


async def _by_embedding(
    fleet: FleetCaller, settings: Mapping[str, Any], texts: Sequence[str], document: object
) -> list[Finding]:
    claims = [
        claim for text in texts for claim in _grounding.claims(text, settings["min_claim_chars"])
    ][: settings["max_claims"]]
    if not claims:
        return []
    context = _grounding.context(document, settings)
    if not context:
        return [Finding("no_context")] if settings["require_context"] else []
    body = {"model": settings["model"], "input": claims + context, "encoding_format": "float"}
    vectors = _vectors(await _ask(fleet, settings, EMBEDDINGS_PATH, body), len(body["input"]))
    try:
        return await asyncio.to_thread(
            _grounding.findings, vectors[: len(claims)], vectors[len(claims) :], settings
        )
    except (TypeError, ValueError):
        raise FleetCheckFailed("the embedding model's vectors are not numbers") from None


def _vectors(answer: Mapping[str, Any], expected: int) -> list[list[float]]:
    """The answer's vectors in input order, checked: one per input, all the same length."""
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != expected:
        raise FleetCheckFailed(f"the embedding model did not return {expected} vectors")
    by_index: dict[int, list[float]] = {}
    for item in data:
        index = item.get("index") if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not isinstance(vector, list) or not vector:
            raise FleetCheckFailed("the embedding model's answer is not float vectors")
        by_index[index] = vector
    if sorted(by_index) != list(range(expected)):
        raise FleetCheckFailed("the embedding model's answer skips inputs")
    vectors = [by_index[i] for i in range(expected)]
    if len({len(v) for v in vectors}) != 1:
        raise FleetCheckFailed("the embedding model's vectors differ in length")
    return vectors
