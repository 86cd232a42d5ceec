"""Response guardrails on a streamed answer: hold back a window of text, check it, release it.

Only a use case with response guardrails gets here; every other stream is relayed byte for
byte. The answer's server-sent events are parsed; each choice's texts (a chat delta's
``content``, refusal, reasoning and tool-call arguments — guardrails/texts.py reads a delta
as a message — or a completion's ``text``) are held back instead of relayed, each text of a
choice on its own (a tool call's arguments apart from the content). When a text holds
twice the plan's window (the most its checks need to see at once: gateway/guardrail_plan.py
WINDOW_CHARS), the text up to its last sentence or word break is checked and released as
one event — redacted if a check redacts; the rest stays held for the next window, so a word
is never cut in two. Events that carry something else (a role, a tool call, the finish
reason, the usage chunk, a tool call's id and name) first release everything held, then go on
as they are, their texts held for later unless the event ends the choice. At the end of the
answer whatever is held is checked and released.

A block (or a check that cannot run, under fail-closed) ends the stream with one
``data: {"error": {...}}`` event, which the OpenAI SDKs raise as an ``APIError``; the caller
then closes the upstream, which makes vLLM stop generating.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.guardrail_plan import StageChecks
from gateway.guardrails.run import Guardrails, blocked_message, merge_findings
from guardrails.texts import Slot, message_slots

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
        # By (choice index, which text): "content", "refusal", "tool_calls.0"… or "text".
        self._held: dict[tuple[int, str], str] = {}
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
            taken += [((index, name), text) for name, text in self._take_texts(choice) if text]
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
        parts: dict[tuple[int, str], str] = {}
        for key, held in self._held.items():
            cut = len(held) if everything else _cut(held, self._window)
            if cut > 0:
                parts[key] = held[:cut]
                self._held[key] = held[cut:]
        self._held = {key: held for key, held in self._held.items() if held}
        if not parts:
            return b""
        keys = list(parts)  # in the order first held: a choice's texts as the model said them
        texts = [parts[key] for key in keys]
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
            self._text_event(key, text) for key, text in zip(keys, result.texts, strict=True)
        )

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
