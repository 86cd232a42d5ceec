"""The endpoints that are not inference: health, version, models, metrics, and fault control.

``/sim/faults`` is the simulator's own; everything else answers as vLLM 0.32 does.
"""

from __future__ import annotations

import time

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from simulator.asgi import Receive, Scope, Send, read_body, send_response
from simulator.errors import bad_request
from simulator.state import VLLM_VERSION, Simulator
from simulator.validation import json_decode_error

_METRICS_TYPE = CONTENT_TYPE_LATEST.encode()


async def health(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    # vLLM: an empty 200 (no content-type) while the engine is alive.
    await send_response(send, 200, b"", content_type=None)


async def load(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    # vLLM counts load only with --enable-server-load-tracking; by default it reads 0.
    await send_response(send, 200, b'{"server_load":0}')


async def version(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    await send_response(send, 200, orjson.dumps({"version": VLLM_VERSION}))


async def models(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    c = sim.config
    created = int(time.time())  # vLLM stamps the card when it is asked for
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": c.model_root,
            "parent": None,
            "max_model_len": c.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{sim.request_id(None)}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for name in c.served_model_names
    ]
    await send_response(send, 200, orjson.dumps({"object": "list", "data": cards}))


async def metrics(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    await send_response(send, 200, sim.metrics.render(), content_type=_METRICS_TYPE)


async def get_faults(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    await send_response(send, 200, orjson.dumps(sim.faults.as_dict()))


async def set_faults(sim: Simulator, scope: Scope, receive: Receive, send: Send) -> None:
    body = await read_body(receive, 1024 * 1024)
    try:
        changes = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError:
        raise json_decode_error(body) from None
    if not isinstance(changes, dict):
        raise bad_request("Expected a JSON object of fault settings")
    sim.faults.update(changes)
    sim.log.warning("faults now %s", sim.faults.as_dict())
    await send_response(send, 200, orjson.dumps(sim.faults.as_dict()))
