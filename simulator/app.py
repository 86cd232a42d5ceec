"""The simulator's raw ASGI application: routing, body decoding, and errors in one place.

Routes follow vLLM's registration: what a model serves depends on its kind, and a path the
kind does not serve is simply not there (404), as in vLLM.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import parse_qsl

import orjson

from runtime.multipart import Form, FormError, is_multipart, parse_form
from simulator import admin
from simulator.asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_response,
)
from simulator.config import SimulatorConfig
from simulator.embeddings import serve_embeddings
from simulator.engine import Clock
from simulator.errors import ApiError, RouteError, validation_error
from simulator.generation import serve_generation
from simulator.protocol import PRIORITY_HEADER, parse_generation
from simulator.state import MAX_BODY_BYTES, Simulator
from simulator.transcriptions import serve_transcription
from simulator.validation import UNSUPPORTED_MEDIA_TYPE, format_error, json_decode_error

Handler = Callable[[Simulator, Scope, Receive, Send], Awaitable[None]]


async def _json_body(scope: Scope, receive: Receive) -> object:
    """The request's JSON, checked in FastAPI's order: syntax, then media type, then presence."""
    body = await read_body(receive, MAX_BODY_BYTES)
    content_type = header(scope, b"content-type")
    media = (content_type or b"").split(b";", 1)[0].strip().lower()
    data: object = None
    json_media = content_type is None or media == b"application/json" or media.endswith(b"+json")
    if json_media and body:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise json_decode_error(body) from None
    if media != b"application/json":
        raise validation_error(UNSUPPORTED_MEDIA_TYPE)
    if not body:
        raise validation_error(
            format_error("missing", "body", "Field required", None), param="body"
        )
    return data


def _request_id(sim: Simulator, scope: Scope, data: object) -> str:
    client_id = header(scope, b"x-request-id")
    if client_id is None and isinstance(data, dict) and isinstance(data.get("request_id"), str):
        return str(data["request_id"])
    return sim.request_id(client_id)


async def chat_completions(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    await _generate(sim, scope, receive, send, chat=True)


async def completions(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    await _generate(sim, scope, receive, send, chat=False)


async def _generate(
    sim: Simulator, scope: Scope, receive: Receive, send: Send, *, chat: bool
) -> None:
    data = await _json_body(scope, receive)
    req = parse_generation(
        data, chat=chat, config=sim.config, priority_header=header(scope, PRIORITY_HEADER)
    )
    plan = sim.faults.plan(streaming=req.stream)
    await serve_generation(sim, req, plan, _request_id(sim, scope, data), receive, send)


async def embeddings(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    data = await _json_body(scope, receive)
    await serve_embeddings(sim, data, _request_id(sim, scope, data), receive, send)


async def transcriptions(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    body = await read_body(receive, MAX_BODY_BYTES)
    content_type = header(scope, b"content-type")
    form = Form()
    if is_multipart(content_type):
        assert content_type is not None
        try:
            form = parse_form(content_type, body)
        except FormError:
            # FastAPI's words for any multipart it cannot parse.
            raise ApiError(
                "There was an error parsing the body", err_type=HTTPStatus.BAD_REQUEST.phrase
            ) from None
    elif content_type and content_type.startswith(b"application/x-www-form-urlencoded"):
        form.fields = dict(parse_qsl(body.decode("latin-1")))
    await serve_transcription(sim, form, _request_id(sim, scope, None), receive, send)


def _routes(kind: str) -> dict[str, dict[str, Handler]]:
    routes: dict[str, dict[str, Handler]] = {
        "/health": {"GET": admin.health},
        "/ping": {"GET": admin.health, "POST": admin.health},
        "/load": {"GET": admin.load},
        "/version": {"GET": admin.version},
        "/v1/models": {"GET": admin.models},
        "/metrics": {"GET": admin.metrics},
        "/sim/faults": {"GET": admin.get_faults, "POST": admin.set_faults},
    }
    if kind in ("chat", "guard"):
        routes["/v1/chat/completions"] = {"POST": chat_completions}
        routes["/v1/completions"] = {"POST": completions}
    elif kind == "embedding":
        routes["/v1/embeddings"] = {"POST": embeddings}
    elif kind == "transcription":
        routes["/v1/audio/transcriptions"] = {"POST": transcriptions}
    return routes


class SimulatorApp:
    """An ASGI app simulating one vLLM replica; ``simulator`` exposes its engine to tests."""

    def __init__(self, config: SimulatorConfig, clock: Clock | None = None) -> None:
        self.simulator = Simulator(config, clock)
        self._routes = _routes(config.kind)
        self._not_found = RouteError(HTTPStatus.NOT_FOUND)
        # FastAPI lists the path's methods in `allow` (no HEAD: vLLM's routes do not add it).
        self._not_allowed = {
            path: RouteError(HTTPStatus.METHOD_NOT_ALLOWED, allow=", ".join(methods))
            for path, methods in self._routes.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await _lifespan(self.simulator, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        methods = self._routes.get(path)
        try:
            if methods is None:
                raise self._not_found
            handler = methods.get(scope["method"])
            if handler is None:
                raise self._not_allowed[path]
            await handler(self.simulator, scope, receive, send)
        except ApiError as err:
            await send_response(send, err.status, err.body(), leading_headers=err.headers)
        except BodyTooLarge:
            too_large = RouteError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            await send_response(send, too_large.status, too_large.body())
        except ClientGone:
            pass


def create_app(config: SimulatorConfig, clock: Clock | None = None) -> SimulatorApp:
    """An ASGI app simulating one vLLM replica; ``clock`` lets tests run in virtual time."""
    return SimulatorApp(config, clock)


async def _lifespan(sim: Simulator, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await sim.engine.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
