"""Response guardrails on a streamed answer: hold back a window of text, check it, release it.

Only a use case with response guardrails gets here; every other stream is relayed byte for
byte. The answer's server-sent events are parsed; each choice's text (a chat delta's
``content``, a completion's ``text``) is held back instead of relayed. When a choice holds
twice the plan's window (the most its checks need to see at once: gateway/guardrails.py
WINDOW_CHARS), the text up to its last sentence or word break is checked and released as
one event — redacted if a check redacts; the rest stays held for the next window, so a word
is never cut in two. Events that carry something else (a role, a tool call, the finish
reason, the usage chunk) first release everything held, then go on as they are. At the end
of the answer whatever is held is checked and released.

A block (or a check that cannot run, under fail-closed) ends the stream with one
``data: {"error": {...}}`` event, which the OpenAI SDKs raise as an ``APIError``; the caller
then closes the upstream, which makes vLLM stop generating.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.guardrails import Guardrails, StageChecks, blocked_message, merge_findings

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_BREAK = re.compile(r"\s")
_DONE = b"[DONE]"


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
    ) -> None:
        self._chat = path == "/v1/chat/completions"
        self._checks = checks
        self._guardrails = guardrails
        self._window = max(1, window_chars)
        self._failure = failure
        self._strip_usage = strip_usage
        self._document = document
        self._partial = b""
        self._held: dict[int, str] = {}
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
        carries_more = False
        for choice in choices:
            if not isinstance(choice, dict):
                carries_more = True
                continue
            index = int(choice.get("index", 0))
            text = self._take_text(choice)
            if text:
                self._held[index] = self._held.get(index, "") + text
            if choice.get("finish_reason") is not None or self._has_more(choice):
                carries_more = True
        if parsed.get("usage"):
            carries_more = True
        if carries_more:
            released = await self._release(everything=True)
            if self.ended:
                return released
            return released + b"data: " + orjson.dumps(parsed) + b"\n\n"
        if any(len(held) >= 2 * self._window for held in self._held.values()):
            return await self._release(everything=False)
        return b""

    def _take_text(self, choice: dict[str, Any]) -> str:
        """The choice's text, taken out of it (the event keeps an empty one)."""
        if self._chat:
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                text: str = delta["content"]
                delta["content"] = ""
                return text
            return ""
        if isinstance(choice.get("text"), str):
            text = choice["text"]
            choice["text"] = ""
            return text
        return ""

    def _has_more(self, choice: Mapping[str, Any]) -> bool:
        """Whether the event says more than text: a role, a tool call…"""
        if not self._chat:
            return False
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        return any(
            value not in (None, "", [])
            for key, value in delta.items()
            if key not in ("content", "role")
        )

    # --- checking and releasing ------------------------------------------------------------
    async def _release(self, *, everything: bool) -> bytes:
        parts: dict[int, str] = {}
        for index, held in self._held.items():
            cut = len(held) if everything else _cut(held, self._window)
            if cut > 0:
                parts[index] = held[:cut]
                self._held[index] = held[cut:]
        self._held = {i: held for i, held in self._held.items() if held}
        if not parts:
            return b""
        indices = sorted(parts)
        texts = [parts[i] for i in indices]
        result = await self._guardrails.run(self._checks, texts, self._document)
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
            self._text_event(i, text) for i, text in zip(indices, result.texts, strict=True)
        )

    def _text_event(self, index: int, text: str) -> bytes:
        if self._chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": None,
            }
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
        return b"data: " + orjson.dumps({**self._template, "choices": [choice]}) + b"\n\n"

    def summaries(self) -> list[dict[str, Any]]:
        """What the stream's windows found, one summary per guardrail and action."""
        return merge_findings(self.findings)


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
