"""A fake vLLM replica that answers at once, at next to no CPU: the overhead benchmark's upstream.

    .venv/bin/python -m bench.gateway.instant_vllm --port 8000 --served-model-name bench-chat

Why it exists: the gateway's throughput and latency targets are defined against a fake vLLM
that answers at once, so that what is measured is the gateway and not its upstream. The
simulator (``simulator``) is held to real vLLM — batching, KV cache, tokenizer, every
field — and every other benchmark and test uses it; even with ``--time-scale 0`` it spends
about 0.25 ms of CPU a request, which on a 2-core machine takes most of a core away from the
process under test. This one is a raw ``asyncio.Protocol`` on uvloop with httptools' request
parser (HTTP/1.1 keep-alive; pipelined requests are answered in order, in one write per
segment), and its answers are rendered once at start-up (by the simulator's own
``wire`` module, so they are shaped as vLLM 0.32's) with only the id and the time left to
fill in per request:

- ``POST /v1/chat/completions``: a 4-token chat completion with ``Content-Length``; with
  ``"stream": true``, vLLM's SSE stream (``Transfer-Encoding: chunked``, one HTTP chunk per
  event: the role chunk, 4 token chunks, the usage chunk when
  ``stream_options.include_usage``, then ``data: [DONE]``), written in one transport write.
  The body is parsed (orjson) only for ``model``, ``stream`` and ``stream_options``.
- ``GET /metrics``: vLLM's waiting and running request gauges and KV-cache usage, all 0 —
  nothing is ever waiting, and a request is answered before the next is read — which is
  what the fleet watcher scrapes.
- ``GET /health``: 200, empty. Anything else: 404.

``--content-bytes N`` makes the answer's text N bytes (its four tokens padded alike) instead
of "The sky is blue": the records benchmark's 1 KB answer.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from typing import Any

import httptools
import orjson
import uvloop

from simulator import wire

COMPLETION_TOKENS = 4
TOKENS = ("The", " sky", " is", " blue")
PROMPT_TOKENS = 20  # the benchmark's prompt, as the simulator counts it
FINGERPRINT = "vllm-0.32.0-00000000"
# Fixed widths, so that every Content-Length and chunk size is known when the answers are
# rendered at start-up: 16 hex digits of id, and a Unix time of 10 digits (until 2286).
_ID_HOLE = b"%(id)s"
_CREATED_HOLE = b"%(created)d"
_ID_WIDTH = 16
_CREATED_WIDTH = 10

_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"
_METRICS = b"text/plain; version=0.0.4; charset=utf-8"


def _head(status: bytes, content_type: bytes | None, length: int | None) -> bytes:
    lines = [b"HTTP/1.1 " + status]
    if content_type is not None:
        lines.append(b"content-type: " + content_type)
    lines.append(
        b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    )
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _fixed(status: bytes, content_type: bytes | None, body: bytes) -> bytes:
    return _head(status, content_type, len(body)) + body


def _error(status: int, message: str, kind: str, param: str | None = None) -> bytes:
    """vLLM's error body."""
    body = orjson.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )
    reason = {400: b"Bad Request", 404: b"Not Found"}[status]
    return _fixed(b"%d %s" % (status, reason), _JSON, body)


class _Template:
    """One answer's bytes with two holes, the response id and its creation time."""

    def __init__(self, rendered: bytes) -> None:
        self.template = rendered
        self.length = len(rendered) + rendered.count(_ID_HOLE) * (_ID_WIDTH - len(_ID_HOLE))
        self.length += rendered.count(_CREATED_HOLE) * (_CREATED_WIDTH - len(_CREATED_HOLE))

    def fill(self, request_id: bytes, created: int) -> bytes:
        return self.template % {b"id": request_id, b"created": created}


def _render(payload: dict[str, Any]) -> bytes:
    """JSON with the id and created holes left open (the model's name comes escaped)."""
    raw = orjson.dumps(payload)
    return raw.replace(b'"@created@"', _CREATED_HOLE)


def tokens_of(content_bytes: int) -> tuple[str, ...]:
    """The answer's four tokens: "The sky is blue", or ``content_bytes`` of text split in four."""
    if content_bytes <= 0:
        return TOKENS
    text = ("The sky is blue. " * (content_bytes // 17 + 1))[:content_bytes]
    cut = [len(text) * i // COMPLETION_TOKENS for i in range(COMPLETION_TOKENS + 1)]
    return tuple(text[cut[i] : cut[i + 1]] for i in range(COMPLETION_TOKENS))


class Replica:
    """The answers of one served model, rendered once."""

    def __init__(self, model: str, tokens: tuple[str, ...] = TOKENS) -> None:
        self.model = model
        self.tokens = tokens
        self._next_id = random.getrandbits(63)
        # "%" in the model name is escaped once here, so the templates can be filled with %.
        name = model.replace("%", "%%")
        request_id = "chatcmpl-" + _ID_HOLE.decode()
        created: Any = "@created@"
        text = "".join(tokens)
        choice = wire.chat_choice(0, text, "length", None)
        self._plain = self._framed_body(
            _render(
                wire.chat_response(
                    request_id,
                    created,
                    name,
                    [choice],
                    PROMPT_TOKENS,
                    COMPLETION_TOKENS,
                    FINGERPRINT,
                )
            )
        )
        self._streams = {
            include_usage: self._framed_stream(
                self._events(request_id, created, name, tokens, include_usage=include_usage)
            )
            for include_usage in (False, True)
        }
        self.metrics = _fixed(b"200 OK", _METRICS, _metrics(model).encode())

    def chat(self, body: bytes) -> bytes:
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"Invalid JSON: {exc}", "BadRequestError")
        if not isinstance(document, dict):
            return _error(400, "The request body must be a JSON object.", "BadRequestError")
        if document.get("model") != self.model:
            return _error(
                404,
                f"The model `{document.get('model')}` does not exist.",
                "NotFoundError",
                "model",
            )
        self._next_id = (self._next_id + 1) & 0xFFFF_FFFF_FFFF_FFFF
        request_id = b"%016x" % self._next_id
        created = int(time.time())
        if document.get("stream") is True:
            options = document.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            return self._streams[include_usage].fill(request_id, created)
        return self._plain.fill(request_id, created)

    @staticmethod
    def _events(
        request_id: str,
        created: Any,
        model: str,
        tokens: tuple[str, ...],
        *,
        include_usage: bool,
    ) -> list[bytes]:
        """vLLM's stream: the fingerprint rides on the usage chunk, or without one on the
        last token's."""
        events = [_render_sse(wire.chat_role_chunk(request_id, created, model, 0, None))]
        for position, token in enumerate(tokens):
            last = position == len(tokens) - 1
            events.append(
                _render_sse(
                    wire.chat_chunk(
                        request_id,
                        created,
                        model,
                        0,
                        token,
                        "length" if last else None,
                        None,
                        None,
                        FINGERPRINT if last and not include_usage else None,
                    )
                )
            )
        if include_usage:
            events.append(
                _render_sse(
                    wire.usage_chunk(
                        request_id,
                        created,
                        model,
                        PROMPT_TOKENS,
                        COMPLETION_TOKENS,
                        FINGERPRINT,
                        chat=True,
                    )
                )
            )
        events.append(wire.DONE)
        return events

    @staticmethod
    def _framed_body(body: bytes) -> _Template:
        length = _Template(body).length
        return _Template(_head(b"200 OK", _JSON, length) + body)

    @staticmethod
    def _framed_stream(events: list[bytes]) -> _Template:
        parts = [_head(b"200 OK", _SSE, None)]
        for event in events:
            parts.append(b"%x\r\n" % _Template(event).length + event + b"\r\n")
        parts.append(b"0\r\n\r\n")
        return _Template(b"".join(parts))


def _render_sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + _render(payload) + b"\n\n"


def _metrics(model: str) -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    labels = f'{{engine="0",model_name="{escaped}"}}'
    gauges = (
        ("vllm:num_requests_running", "Number of requests in model execution batches."),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    )
    return "".join(
        f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name}{labels} 0.0\n"
        for name, help_text in gauges
    )


HEALTHY = _fixed(b"200 OK", None, b"")
NOT_FOUND = _fixed(b"404 Not Found", _JSON, b'{"detail":"Not Found"}')
BAD_REQUEST = _fixed(b"400 Bad Request", _JSON, b'{"detail":"Bad Request"}')
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
CLOSE = b"\r\nconnection: close"


class _Connection(asyncio.Protocol):
    """One client connection; every answer a segment's requests produce goes out in one write."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.expect_continue = False
        self.out: list[bytes] = []
        self.closing = False

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's does not subclass it

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.out.append(_closing(BAD_REQUEST))
            self.closing = True
        assert self.transport is not None
        if self.out:
            self.transport.write(self.out[0] if len(self.out) == 1 else b"".join(self.out))
            self.out.clear()
        if self.closing:
            self.transport.close()

    def pause_writing(self) -> None:
        # A client that does not read its answers is not read from either.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    # --- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.expect_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True

    def on_headers_complete(self) -> None:
        if self.expect_continue:
            self.out.append(CONTINUE)
            assert self.transport is not None
            self.transport.write(b"".join(self.out))  # the client waits for it to send a body
            self.out.clear()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.closing:
            return
        answer = self.answer(self.parser.get_method(), self.url.split(b"?", 1)[0])
        if not self.parser.should_keep_alive():
            answer = _closing(answer)
            self.closing = True
        self.out.append(answer)

    def answer(self, method: bytes, path: bytes) -> bytes:
        if method == b"POST" and path == b"/v1/chat/completions":
            return self.replica.chat(b"".join(self.body))
        if method == b"GET":
            if path == b"/metrics":
                return self.replica.metrics
            if path == b"/health":
                return HEALTHY
        return NOT_FOUND


def _closing(answer: bytes) -> bytes:
    """The answer with ``connection: close`` after its status line."""
    end = answer.index(b"\r\n")
    return answer[:end] + CLOSE + answer[end:]


async def serve(host: str, port: int, replica: Replica) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(replica), host, port, backlog=2048, reuse_address=True
    )
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        print(f"instant vLLM serving {replica.model!r} on http://{host}:{port}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument(
        "--content-bytes", type=int, default=0, help="the answer's text size (0: 4 short words)"
    )
    args = parser.parse_args()
    replica = Replica(args.served_model_name, tokens_of(args.content_bytes))
    uvloop.run(serve(args.host, args.port, replica))


if __name__ == "__main__":
    main()
