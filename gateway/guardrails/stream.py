"""Response guardrails on a streamed answer: hold back a window of text, check it, release it.

Only a use case with response guardrails gets here; every other stream is relayed byte for
byte. The answer's server-sent events are parsed; each choice's texts (a chat delta's
``content``, refusal, reasoning and tool-call arguments — guardrails/texts.py reads a delta
as a message — or a completion's ``text``) are held back instead of relayed, each text of a
choice on its own (a tool call's arguments apart from the content). When a text holds
twice the plan's window W (the most its checks need to see at once: gateway/guardrail_plan.py
WINDOW_CHARS), the text up to its last word break before ``len - W`` is checked and released
as one event — redacted if a check redacts; the rest stays held for the next window, so a
word is never cut in two. Events that carry something else (a role, a tool call, the finish
reason, the usage chunk, a tool call's id and name) first release everything held, then go on
as they are, their texts held for later unless the event ends the choice. At the end of the
answer whatever is held is checked and released.

An entity with spaces in it (a name, a phone or card number written in groups, a banned
phrase, a password in words) can straddle that cut, and each half alone is clean. So before a
cut is taken it is probed: the span checks (those the catalogue says point at spans, or that
the use case set to redact) run once more, all as ``redact``, on the boundary region
``held[cut - O : cut + O]`` (O = W / 2: it holds whole any entity up to O long that crosses
the cut — 64 characters for PII and banned substrings, 128 for secrets) and on its two
halves, in one service call. The service answers texts, not spans, but that is enough: when
no span crosses the cut, the region redacts to its two halves' redactions joined; when they
differ, the cut is not taken — the text stays held and the next word break is tried as more
arrives (a cut once found to split is not probed again), so the entity goes out whole in a
later window. The probe's findings are discarded: the released text's own check is what is
recorded, so nothing is counted twice and nothing released is sent again. Classifiers
(toxicity, language, the fleet's models) are not probed, they judge a window, not spans; a
stream whose checks have no span check pays nothing. A probe that cannot run counts as its
checks failing (the use case's failure mode decides; under "open" the cut is taken).

The cost: one more service call per window, run alongside the window's check (its answer
is dropped when the cut moves), on 4·O characters (the region and its halves) — measured
on a 5,480-character answer under PII redaction and a banned-substrings block, W = 128,
one worker: 42 → 83 calls, 5,480 → 15,976 characters checked, the stream's check time
0.9 → 2.6 s. Only guarded streams with a span check pay it.

Groundedness by logprobs (a use case whose plan asks for them, ``GuardPlan.logprobs``) reads
each chunk's token logprobs as it arrives (``choice.logprobs``, vLLM's per-chunk shape) and
takes them out of the event unless the client asked for them too. Each window's check judges
the tokens that arrived since the last one — ahead of the text released, so a span is
found before its text goes out — less the run of unsure tokens they end on, which waits for
the next window so a span is judged whole; at the end of the answer everything left is
judged. A span longer than the window may have begun to go out before it is found: a block
then ends the stream mid-span. A guarded stream relays no logprobs in the text events it
rebuilds (``logprobs: null``), as before, even when the client asked for them.

A block (or a check that cannot run, under fail-closed) ends the stream with one
``data: {"error": {...}}`` event, which the OpenAI SDKs raise as an ``APIError``; the caller
then closes the upstream, which makes vLLM stop generating.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gateway.guardrail_plan import StageChecks
from gateway.guardrails.client import GuardrailUnavailable
from gateway.guardrails.fleet import Answered
from gateway.guardrails.run import Guardrails, StageResult, blocked_message, merge_findings
from guardrails import confidence
from guardrails.base import SettingsError
from guardrails.catalogue import entries
from guardrails.grounding import DEFAULT_MIN_LOGPROB, GroundednessCheck, needs_logprobs
from guardrails.protocol import CheckSpec
from guardrails.texts import Slot, message_slots

logger = logging.getLogger("gateway.guardrails")

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_BREAK = re.compile(r"\s")
_DONE = b"[DONE]"
# The probe looks this fraction of the window either side of a cut: entities up to that long
# are found whole (a window is sized for its checks' longest entity; the ones with spaces —
# names, numbers in groups, phrases — are far shorter), at half the characters of O = W.
_OVERLAP_PART = 2


def error_event(message: str, code: str, type_: str = "invalid_request_error") -> bytes:
    error = {"error": {"message": message, "type": type_, "code": code, "param": None}}
    return b"data: " + orjson.dumps(error) + b"\n\n"


class GuardedStream:
    """One streamed answer under response guardrails. ``feed`` each upstream chunk and send
    what it returns; ``finish`` at the end. Once ``ended``, send nothing more."""

    def __init__(
        self,
        *,
        path: str,
        checks: StageChecks,
        guardrails: Guardrails,
        window_chars: int,
        failure: str,
        strip_usage: bool,
        document: Any,
        logprobs: bool = False,
    ) -> None:
        self._chat = path == "/v1/chat/completions"
        # Token logprobs by choice, not judged yet (only when a check reads them).
        self._logprobs = logprobs
        self._keep_logprobs = confidence.client_asked(path, document)
        self._tokens: dict[int, list[confidence.Token]] = {}
        self._missing_logprobs = False
        self._min_logprob = _min_logprob(checks) if logprobs else DEFAULT_MIN_LOGPROB
        self._checks = checks
        self._guardrails = guardrails
        self._window = max(1, window_chars)
        self._overlap = max(1, self._window // _OVERLAP_PART)
        self._failure = failure
        self._strip_usage = strip_usage
        self._document = document
        self._partial = b""
        # By (choice index, which text): "content", "refusal", "tool_calls.0"… or "text".
        self._held: dict[tuple[int, str], str] = {}
        # Cuts (offsets in the held text) a probe found to split a span: not probed again.
        self._split: dict[tuple[int, str], set[int]] = {}
        self._probe_checks = span_checks(checks.service)
        self._template: dict[str, Any] = {}
        self.findings: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self.ended = False

    async def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        out: list[bytes] = []
        at = 0
        for match in _EVENT_END.finditer(data):
            event = data[at : match.end()]
            at = match.end()
            out.append(await self._event(event))
            if self.ended:
                return b"".join(out)
        self._partial = data[at:]
        return b"".join(out)

    async def finish(self) -> bytes:
        """At the end of the answer: what is still held, checked (and a last partial event)."""
        if self.ended:
            return b""
        out = await self._release(everything=True)
        if not self.ended and self._partial:
            out += self._partial
        self._partial = b""
        return out

    # --- events ----------------------------------------------------------------------------
    async def _event(self, event: bytes) -> bytes:
        payload = _data(event)
        if payload is None:
            return event  # a comment or keep-alive: nothing to check
        if payload == _DONE:
            return await self._release(everything=True) + (b"" if self.ended else event)
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return await self._release(everything=True) + (b"" if self.ended else event)
        choices = parsed.get("choices") if isinstance(parsed, dict) else None
        if not isinstance(choices, list):
            return await self._release(everything=True) + (b"" if self.ended else event)
        if not choices:  # the usage chunk
            released = await self._release(everything=True)
            if self.ended or self._strip_usage:
                return released
            return released + event
        if not self._template:
            self._template = {k: v for k, v in parsed.items() if k not in ("choices", "usage")}
        carries_more = ends = bool(parsed.get("usage"))
        taken: list[tuple[tuple[int, str], str]] = []
        for choice in choices:
            if not isinstance(choice, dict):
                carries_more = True
                continue
            index = int(choice.get("index", 0))
            texts = [((index, name), text) for name, text in self._take_texts(choice) if text]
            if self._logprobs:
                self._take_logprobs(index, choice, bool(texts))
            taken += texts
            if choice.get("finish_reason") is not None:
                carries_more = ends = True
            elif self._has_more(choice):
                carries_more = True
        if carries_more and not ends:
            # A tool call's id and name (or a role…) go out before its arguments.
            released = await self._release(everything=True)
            if self.ended:
                return released
            self._hold(taken)
            return released + b"data: " + orjson.dumps(parsed) + b"\n\n"
        self._hold(taken)
        if carries_more:
            released = await self._release(everything=True)
            if self.ended:
                return released
            return released + b"data: " + orjson.dumps(parsed) + b"\n\n"
        if any(len(held) >= 2 * self._window for held in self._held.values()):
            return await self._release(everything=False)
        return b""

    def _take_logprobs(self, index: int, choice: dict[str, Any], has_text: bool) -> None:
        tokens = confidence.choice_tokens(choice.get("logprobs"))
        if tokens is not None:
            self._tokens.setdefault(index, []).extend(tokens)
        elif has_text:
            self._missing_logprobs = True  # text without its logprobs: the check cannot run
        if not self._keep_logprobs and "logprobs" in choice:
            choice["logprobs"] = None

    def _judged(self, everything: bool) -> dict[int, list[confidence.Token]]:
        """The tokens this window judges: all of them at the end, else all but the run of
        unsure tokens they end on."""
        if everything:
            return {i: list(tokens) for i, tokens in self._tokens.items()}
        return {
            i: tokens[: confidence.open_run(tokens, self._min_logprob)]
            for i, tokens in self._tokens.items()
        }

    def _hold(self, taken: list[tuple[tuple[int, str], str]]) -> None:
        for key, text in taken:
            self._held[key] = self._held.get(key, "") + text

    def _take_texts(self, choice: dict[str, Any]) -> list[tuple[str, str]]:
        """The choice's texts, by name, taken out of it (the event keeps empty ones)."""
        if not self._chat:
            if isinstance(choice.get("text"), str):
                text: str = choice["text"]
                choice["text"] = ""
                return [("text", text)]
            return []
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return []
        slots: list[Slot] = []
        message_slots(delta, slots)
        if not slots:
            return []
        names: dict[int, str] = {}
        for j, call in enumerate(delta.get("tool_calls") or ()):
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                names[id(call["function"])] = f"tool_calls.{call.get('index', j)}"
        if isinstance(delta.get("function_call"), dict):
            names[id(delta["function_call"])] = "function_call"
        taken = []
        for container, key, _ in slots:
            name = key if container is delta else names.get(id(container))
            if name is not None:
                taken.append((name, container[key]))
                container[key] = ""
        return taken

    def _has_more(self, choice: Mapping[str, Any]) -> bool:
        """Whether the event says more than text: a tool call's id or name, a role…"""
        if not self._chat:
            return False
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        for key, value in delta.items():
            if key in ("content", "role") or _empty(value):
                continue
            if key == "tool_calls" and isinstance(value, list):
                if all(isinstance(call, dict) and _bare_call(call) for call in value):
                    continue
            elif key == "function_call" and isinstance(value, dict) and _bare_call(value):
                continue
            return True
        return False

    # --- checking and releasing ------------------------------------------------------------
    async def _release(self, *, everything: bool) -> bytes:
        cuts: dict[tuple[int, str], int] = {}
        for key, held in self._held.items():
            cut = len(held) if everything else _cut(held, self._window)
            if cut > 0 and (everything or cut not in self._split.get(key, ())):
                cuts[key] = cut
        if not cuts:
            return b""
        judged = self._judged(everything) if self._logprobs else {}
        if everything or not self._probe_checks:
            result = await self._check(cuts, judged)
        else:
            # The probe runs alongside the check; the check's answer is dropped if a cut moves.
            result, (split, failed) = await asyncio.gather(
                self._check(cuts, judged), self._probe(cuts)
            )
            if split:
                for key in split:
                    self._split.setdefault(key, set()).add(cuts.pop(key))
                if not cuts:
                    return b""
                result = await self._check(cuts, judged)
            result.failed += [name for name in failed if name not in result.failed]
        for i, tokens in judged.items():
            self._tokens[i] = self._tokens[i][len(tokens) :]
        keys = list(cuts)  # in the order first held: a choice's texts as the model said them
        for key in keys:
            self._held[key] = self._held[key][cuts[key] :]
            self._split.pop(key, None)
        self._held = {key: held for key, held in self._held.items() if held}
        self.findings += result.findings
        self.failed += [name for name in result.failed if name not in self.failed]
        if result.blocked is not None:
            self.ended = True
            return error_event(blocked_message(result.blocked, "response"), "guardrail_blocked")
        if result.failed and self._failure == "closed":
            self.ended = True
            return error_event(
                f"The response guardrails ({', '.join(result.failed)}) could not run.",
                "guardrail_unavailable",
                "service_unavailable",
            )
        return b"".join(
            self._text_event(key, text) for key, text in zip(keys, result.texts, strict=True)
        )

    async def _check(
        self, cuts: Mapping[tuple[int, str], int], judged: dict[int, list[confidence.Token]]
    ) -> StageResult:
        """Every check of the stage on each held text up to its cut (and the tokens judged)."""
        texts = [self._held[key][:cut] for key, cut in cuts.items()]
        document = self._document
        if self._logprobs:
            document = Answered(document, None if self._missing_logprobs else judged)
        return await self._guardrails.run(self._checks, texts, document)

    async def _probe(
        self, cuts: Mapping[tuple[int, str], int]
    ) -> tuple[set[tuple[int, str]], list[str]]:
        """The held texts whose cut splits a span (a span check redacts the boundary region
        otherwise than its two halves), and the checks that failed if the probe could not run.
        One service call for every text; its findings are not kept."""
        texts: list[str] = []
        for key, cut in cuts.items():
            held = self._held[key]
            start, end = max(0, cut - self._overlap), min(len(held), cut + self._overlap)
            texts += [held[start:cut], held[cut:end], held[start:end]]
        try:
            outcome = await self._guardrails.service.run(
                self._checks.stage, texts, self._probe_checks
            )
            redacted = outcome["texts"]
            if not isinstance(redacted, list) or len(redacted) != len(texts):
                raise GuardrailUnavailable("the probe's answer has not one text per text")
        except (GuardrailUnavailable, KeyError, TypeError) as exc:
            logger.warning(
                "guardrail_unavailable stage=%s probe reason=%s", self._checks.stage, exc
            )
            return set(), [check.guardrail for check in self._probe_checks]
        return {
            key
            for i, key in enumerate(cuts)
            if redacted[3 * i] + redacted[3 * i + 1] != redacted[3 * i + 2]
        }, []

    def _text_event(self, key: tuple[int, str], text: str) -> bytes:
        index, name = key
        if not self._chat:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
        else:
            delta: dict[str, Any]
            if name.startswith("tool_calls."):
                call = {"index": int(name.removeprefix("tool_calls.")), "function": {}}
                delta = {"tool_calls": [{**call, "function": {"arguments": text}}]}
            elif name == "function_call":
                delta = {"function_call": {"arguments": text}}
            else:
                delta = {name: text}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return b"data: " + orjson.dumps({**self._template, "choices": [choice]}) + b"\n\n"

    def summaries(self) -> list[dict[str, Any]]:
        """What the stream's windows found, one summary per guardrail and action."""
        return merge_findings(self.findings)


def span_checks(checks: Sequence[CheckSpec]) -> tuple[CheckSpec, ...]:
    """The checks whose findings point at spans, as ``redact`` checks: those the catalogue
    says redact, or that the use case set to redact (governance allowed it, so they do)."""
    catalogue = entries()
    return tuple(
        CheckSpec(check.guardrail, "redact", check.settings)
        for check in checks
        if check.action == "redact"
        or ((entry := catalogue.get(check.guardrail)) is not None and entry.redacts)
    )


def _min_logprob(checks: StageChecks) -> float:
    """The threshold the stream's logprob check judges tokens by (its settings validated
    as the check will; unusable settings fail the check itself, not the stream)."""
    for check in checks.fleet:
        if check.guardrail == GroundednessCheck.name and needs_logprobs(check.settings):
            try:
                return float(GroundednessCheck().validate(check.settings)["min_logprob"])
            except SettingsError:
                break
    return DEFAULT_MIN_LOGPROB


def _empty(value: object) -> bool:
    return value is None or value == "" or value == []


def _bare_call(call: Mapping[str, Any]) -> bool:
    """A tool call (or function call) delta that, its arguments taken, says nothing more."""
    for key, value in call.items():
        if key == "index" or _empty(value):
            continue
        if key == "function" and isinstance(value, dict) and all(map(_empty, value.values())):
            continue
        return False
    return True


def _data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _cut(held: str, window: int) -> int:
    """Where to cut ``held`` so at least ``window`` characters stay held: after the last
    word break before that point; 0 when there is none yet."""
    limit = len(held) - window
    if limit <= 0:
        return 0
    best = 0
    for match in _BREAK.finditer(held, 0, limit):
        best = match.end()
    return best
