"""Token counts of a relayed response, read off the bytes as they pass — no buffering.

vLLM reports ``usage`` in a non-streaming body and, when asked for with
``stream_options.include_usage``, in the last data chunk of a stream. The gateway asks for it
on every stream (``with_usage_requested``) and, for a client that did not, removes that chunk
again on the way out (``UsageEventFilter``): the counts it records and reconciles the token
windows with are then vLLM's own. Only a stream that ends early, or an upstream that ignores
``stream_options``, leaves an estimate: one data line per generated token, and the prompt at
the admission estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.costs import AUDIO_TOKENS_PER_SECOND
from runtime.http import with_member

_USAGE = b'"usage"'
_DATA = b"data: "
_DONE = b"data: [DONE]"
_JSON_KEEP_LIMIT = 1 << 20  # non-streaming bodies up to this size are parsed whole
_TAIL_KEEP = 1 << 16  # of a larger one only its end is kept: vLLM writes ``usage`` last
_LINE_KEEP_LIMIT = 1 << 16  # a stream's unfinished line is carried over up to this size
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")  # SSE allows either; vLLM writes the first
_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')
_EVENT_KEEP_LIMIT = 1 << 20  # an unfinished event is held back up to this size


def asks_for_usage(document: dict[str, Any]) -> bool:
    """Whether vLLM would send this stream's usage chunk as the client wrote it: a non-empty
    ``stream_options`` whose ``include_usage`` is not false (vLLM's default is true)."""
    options = document.get("stream_options")
    return isinstance(options, dict) and bool(options) and bool(options.get("include_usage", True))


def with_usage_requested(body: bytes, document: dict[str, Any]) -> bytes | None:
    """``body`` (the JSON object ``document``) asking for the stream's usage chunk, or None
    when its ``stream_options`` is not an object (vLLM refuses it; it goes as it is).

    Without ``stream_options`` the member is spliced in (``with_member``) rather than the
    body serialised again; otherwise the object is serialised with ``include_usage`` set."""
    options = document.get("stream_options")
    if options is None and "stream_options" not in document:
        return with_member(body, b'"stream_options":{"include_usage":true}')
    if not isinstance(options, dict):
        return None
    return orjson.dumps({**document, "stream_options": {**options, "include_usage": True}})


class UsageEventFilter:
    """Removes the usage-only event (``"choices": []`` and a ``usage`` object) from a stream
    whose client did not ask for it: the gateway did, to count tokens, and client code that
    reads ``chunk.choices[0]`` breaks on that event.

    Events pass through as they come. One that a read cut in two is held until its blank
    line arrives: an SSE client acts on an event only then, so holding it costs the client
    nothing. The check is a byte search; only an event with empty ``choices`` is parsed."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    def __call__(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        end = max(_after(data.rfind(sep), sep) for sep in _EVENT_ENDS)
        if len(data) - end > _EVENT_KEEP_LIMIT:
            end = len(data)  # not an event stream as vLLM writes one: pass it on, not grow
        self._held = data[end:]
        complete = data[:end] if end < len(data) else data
        if _EMPTY_CHOICES[0] in complete or _EMPTY_CHOICES[1] in complete:
            complete = _without_usage_events(complete)
        return complete

    def flush(self) -> bytes:
        """What is still held when the stream ends (an event without its blank line)."""
        held, self._held = self._held, b""
        return _without_usage_events(held)


def _after(at: int, sep: bytes) -> int:
    """Where the event ending with the ``sep`` found at ``at`` ends (0: none found)."""
    return at + len(sep) if at >= 0 else 0


def _without_usage_events(data: bytes) -> bytes:
    """``data`` less its usage-only events, found from their empty ``choices``."""
    for mark in _EMPTY_CHOICES:
        search = 0
        while (at := data.find(mark, search)) >= 0:
            begin = max(_after(data.rfind(sep, 0, at), sep) for sep in _EVENT_ENDS)
            ends = [_after(data.find(sep, at), sep) for sep in _EVENT_ENDS]
            end = min([e for e in ends if e] or [len(data)])
            if _usage_only(data[begin:end]):
                data = data[:begin] + data[end:]
                search = begin
            else:
                search = at + len(mark)
    return data


def _usage_only(event: bytes) -> bool:
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                payload = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return False
            return (
                isinstance(payload, dict)
                and payload.get("choices") == []
                and isinstance(payload.get("usage"), dict)
            )
    return False


@dataclass(slots=True)
class UsageMeter:
    streaming: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False
    first_chunk_at: float | None = None
    _data_lines: int = 0
    _body: bytearray | None = None
    _tail: bytes | None = None  # the end of a body too large to keep whole
    _partial: bytes = b""  # a stream's line begun in an earlier chunk

    def feed(self, chunk: bytes) -> None:
        if self.streaming:
            # Lines are read whole: a chunk boundary (TCP's, not the replica's) can fall
            # anywhere in an event, so the unfinished last line waits for the next chunk.
            data = self._partial + chunk if self._partial else chunk
            end = data.rfind(b"\n") + 1
            lines, rest = data[:end], data[end:]
            self._partial = rest if len(rest) <= _LINE_KEEP_LIMIT else b""
            if lines:
                self._data_lines += lines.count(_DATA) - lines.count(_DONE)
                if _USAGE in lines:
                    self._read_stream_usage(lines)
        elif self._tail is not None:
            self._tail = _last(self._tail, chunk)
        else:
            if self._body is None:
                self._body = bytearray()
            if len(self._body) + len(chunk) <= _JSON_KEEP_LIMIT:
                self._body += chunk
            else:
                # Too large to parse whole (64 embeddings of 1,024 floats are ~1.4 MB): keep
                # the end, where the usage is, and let the rest go.
                self._tail = _last(bytes(self._body[-_TAIL_KEEP:]), chunk)
                self._body = None

    def finish(self, prompt_estimate: int = 0) -> None:
        """The counts are final. ``prompt_estimate``: the prompt's tokens as admission
        estimated them, for a stream that ended without reporting its usage."""
        if self.streaming:
            if self._partial:  # the stream ended without a newline after its last line
                self.feed(b"\n")
            if not self.reported:
                # One chunk per token, less the role chunk and the closing chunk.
                self.completion_tokens = max(self._data_lines - 2, 0)
                self.prompt_tokens = prompt_estimate
            return
        if self._tail is not None:
            self._take(_usage_at_end(self._tail))
        elif self._body:
            try:
                usage = orjson.loads(self._body).get("usage")
            except (orjson.JSONDecodeError, AttributeError):
                return
            self._take(usage)

    def _read_stream_usage(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line.startswith(_DATA) and _USAGE in line:
                try:
                    usage = orjson.loads(line[len(_DATA) :]).get("usage")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                self._take(usage)

    def _take(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        if usage.get("type") == "duration":
            # A transcription's usage is seconds of audio (OpenAI's shape, and vLLM's):
            # counted as admission estimated it, so that reconcile does not refund it all.
            seconds = usage.get("seconds")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool):
                self.prompt_tokens = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
                self.reported = True
            return
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        self.reported = True


def _last(kept: bytes, chunk: bytes) -> bytes:
    """The last _TAIL_KEEP bytes of ``kept + chunk``."""
    if len(chunk) >= _TAIL_KEEP:
        return chunk[-_TAIL_KEEP:]
    return (kept + chunk)[-_TAIL_KEEP:]


def _usage_at_end(tail: bytes) -> object:
    """The value of the last top-level-looking ``"usage": {...}`` member in ``tail`` (the
    end of a JSON body), or None. A ``"usage"`` inside a string is escaped (``\\"usage\\"``)
    and skipped."""
    at = len(tail)
    while (at := tail.rfind(_USAGE, 0, at)) >= 0:
        if at > 0 and tail[at - 1] == 0x5C:  # a backslash: inside a string
            continue
        start = tail.find(b"{", at + len(_USAGE))
        if start < 0 or tail[at + len(_USAGE) : start].strip() != b":":
            continue
        end = _object_end(tail, start)
        if end < 0:
            return None
        try:
            return orjson.loads(tail[start:end])
        except orjson.JSONDecodeError:
            return None
    return None


def _object_end(data: bytes, start: int) -> int:
    """Where the JSON object opening at ``start`` ends (exclusive), or -1 if it does not."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(data)):
        byte = data[i]
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x7B:
            depth += 1
        elif byte == 0x7D:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1
