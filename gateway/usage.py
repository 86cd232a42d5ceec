"""Token counts of a relayed response, read off the bytes as they pass — no buffering.

vLLM reports ``usage`` in a non-streaming body and, when the client asked for
``stream_options.include_usage``, in the last data chunk of a stream. Without it, a stream
still carries one chunk per generated token, so counting data lines is a close estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

_USAGE = b'"usage"'
_DATA = b"data: "
_DONE = b"data: [DONE]"
_JSON_KEEP_LIMIT = 1 << 20  # non-streaming bodies larger than this are not parsed for usage
_LINE_KEEP_LIMIT = 1 << 16  # a stream's unfinished line is carried over up to this size


@dataclass(slots=True)
class UsageMeter:
    streaming: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False
    first_chunk_at: float | None = None
    _data_lines: int = 0
    _body: bytearray | None = None
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
        else:
            if self._body is None:
                self._body = bytearray()
            if len(self._body) + len(chunk) <= _JSON_KEEP_LIMIT:
                self._body += chunk

    def finish(self) -> None:
        if self.streaming:
            if self._partial:  # the stream ended without a newline after its last line
                self.feed(b"\n")
            if not self.reported:
                # One chunk per token, less the role chunk and the closing chunk.
                self.completion_tokens = max(self._data_lines - 2, 0)
            return
        if self._body:
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
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.reported = True
