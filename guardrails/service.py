"""The guardrail service: the process the gateways send their worker-run checks to.

``python -m guardrails.service`` listens on loopback (``SWITCHYARD_GUARDRAIL_HOST``/``_PORT``)
and runs checks in a pool of ``SWITCHYARD_GUARDRAIL_WORKERS`` processes, each with its
detectors loaded once at start (guardrails/workers.py). Detectors are CPU-bound, so they never
run on a gateway's event loop; any number of gateway processes share one service. The HTTP
side is aiohttp; the protocol is guardrails/protocol.py.

Concurrent checks arriving within ``SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS`` of each other (up
to ``SWITCHYARD_GUARDRAIL_BATCH_MAX``) go to one worker as one job, each answered as alone; a
batch shares its fate (guardrails/batching.py). A request refused (400, 401, 413) never joins
one.

``GET /healthz``: 200 while at least one worker is ready. ``GET /metrics``: Prometheus, the
checks answered (by stage and outcome; a bulk's bodies each count), their latency, the
requests per job sent to a worker (batch sizes), the bodies per bulk call, workers ready and
replaced.

Callers authenticate with a shared secret (``SWITCHYARD_GUARDRAIL_TOKEN``, or ``…_FILE``) as
``Authorization: Bearer …`` on ``/v1/check``; the probes stay open. Without a token the
service listens on loopback only: it refuses to start bound to another address. A check whose
texts are over ``SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS`` is refused (413) before any worker
sees it — the gateway refuses the same budget before sending, so a client cannot make the
service time out, kill and reload workers with long texts.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from guardrails.batching import Batcher
from guardrails.catalogue import entries
from guardrails.protocol import (
    CHECK_BULK_PATH,
    CHECK_PATH,
    DEFAULT_MAX_TEXT_CHARS,
    HEALTH_PATH,
    METRICS_PATH,
    TOKEN_ENV,
    BulkCheckRequest,
    CheckRequest,
    InvalidCheck,
    OverBudget,
    error_body,
    parse_bulk_request,
    parse_request,
)
from guardrails.workers import CheckFailed, CheckTimeout, PoolBusy, WorkerPool
from runtime.env import ConfigurationError, env_float, env_int, env_list, env_str

logger = logging.getLogger("guardrails.service")

PREFIX = "switchyard_guardrail_service_"
# Seconds: a regex check takes microseconds, a spaCy pass a few hundred milliseconds.
CHECK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
BULK_BUCKETS = (1, 10, 100, 250, 500, 1000, 2500, 5000)


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    host: str
    port: int
    workers: int
    check_timeout_s: float
    queue_timeout_s: float
    load_timeout_s: float
    preload: tuple[str, ...]
    max_body_bytes: int
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    token: str = ""  # the callers' shared secret; empty: loopback only
    batch_window_s: float = 0.0  # 0: one job per request
    batch_max: int = 8  # requests in one batch

    @classmethod
    def from_env(cls) -> ServiceSettings:
        return cls(
            host=env_str("SWITCHYARD_GUARDRAIL_HOST", "127.0.0.1"),
            port=env_int("SWITCHYARD_GUARDRAIL_PORT", 8095, minimum=1),
            workers=env_int("SWITCHYARD_GUARDRAIL_WORKERS", 2, minimum=1),
            check_timeout_s=env_float(
                "SWITCHYARD_GUARDRAIL_CHECK_TIMEOUT_SECONDS", 2.0, minimum=0.01
            ),
            queue_timeout_s=env_float(
                "SWITCHYARD_GUARDRAIL_QUEUE_TIMEOUT_SECONDS", 2.0, minimum=0.01
            ),
            load_timeout_s=env_float(
                "SWITCHYARD_GUARDRAIL_LOAD_TIMEOUT_SECONDS", 300.0, minimum=1.0
            ),
            # Which detectors each worker loads at start ("all": every worker-run one in the
            # catalogue). One not listed still loads, on its first check.
            preload=tuple(env_list("SWITCHYARD_GUARDRAIL_PRELOAD", ["all"])),
            max_body_bytes=env_int(
                "SWITCHYARD_GUARDRAIL_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024
            ),
            max_text_chars=env_int(
                "SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS", DEFAULT_MAX_TEXT_CHARS, minimum=1
            ),
            token=env_str("SWITCHYARD_GUARDRAIL_TOKEN", ""),
            # A few ms: a light load pays at most this; under load a batch also grows while
            # it waits for a free worker (guardrails/batching.py).
            batch_window_s=env_float("SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS", 0.0, minimum=0.0)
            / 1000,
            batch_max=env_int("SWITCHYARD_GUARDRAIL_BATCH_MAX", 8, minimum=1),
        ).checked()

    def checked(self) -> ServiceSettings:
        """Refuse to serve unauthenticated checks beyond this machine."""
        if not self.token and not _loopback(self.host):
            raise ConfigurationError(
                f"SWITCHYARD_GUARDRAIL_HOST={self.host!r} is not a loopback address: set "
                f"{TOKEN_ENV} (or {TOKEN_ENV}_FILE) so that only the gateways can ask for checks"
            )
        return self

    def preload_names(self) -> list[str]:
        if "all" in self.preload:
            return [name for name, entry in entries().items() if entry.runs_on == "worker"]
        return [name for name in self.preload if name]


class _Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.checks = Counter(
            PREFIX + "checks",
            "Check requests answered, by stage and outcome.",
            ["stage", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            PREFIX + "check_seconds",
            "Time to answer a check request (waiting for a worker included).",
            ["stage"],
            buckets=CHECK_BUCKETS,
            registry=r,
        )
        self.replaced = Counter(
            PREFIX + "workers_replaced",
            "Workers killed and replaced (timeout, crashed, cancelled).",
            ["reason"],
            registry=r,
        )
        self.ready = Gauge(PREFIX + "workers_ready", "Workers loaded and alive.", registry=r)
        self.batch_size = Histogram(
            PREFIX + "batch_size",
            "Check requests sent to a worker as one job (1: not batched).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.bulk_size = Histogram(
            PREFIX + "bulk_size",
            "Requests' texts checked by one bulk call (/v1/check/bulk).",
            buckets=BULK_BUCKETS,
            registry=r,
        )
        self.bulk_latency = Histogram(
            PREFIX + "bulk_seconds",
            "Time to answer a bulk call (all its bodies).",
            ["stage"],
            buckets=(*CHECK_BUCKETS, 30.0, 60.0),
            registry=r,
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_POOL = web.AppKey("pool", WorkerPool)
_BATCHER = web.AppKey("batcher", Batcher)
_METRICS = web.AppKey("metrics", _Metrics)
_SETTINGS = web.AppKey("settings", ServiceSettings)
_STATUS = {PoolBusy: 503, CheckTimeout: 504}
_Parsed = TypeVar("_Parsed", CheckRequest, BulkCheckRequest)


async def _read_check(
    request: web.Request, parse: Callable[[bytes, int], _Parsed]
) -> _Parsed | web.Response:
    """A check request's body, parsed by ``parse`` under the text budget, once the caller has
    shown the service token; or the refusal to answer (401, 413, 400), counted."""
    metrics = request.app[_METRICS]
    settings = request.app[_SETTINGS]
    if settings.token and not _authorised(request, settings.token):
        metrics.checks.labels("unknown", "unauthorised").inc()
        return _json(401, error_body("A valid service token is required.", "unauthorised"))
    try:
        return parse(await request.read(), settings.max_text_chars)
    except OverBudget as exc:
        metrics.checks.labels("unknown", "over_budget").inc()
        return _json(413, error_body(str(exc), "guardrail_text_too_large"))
    except InvalidCheck as exc:
        metrics.checks.labels("unknown", "invalid").inc()
        return _json(400, error_body(str(exc), "invalid_check"))


async def check(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    started = time.monotonic()
    parsed = await _read_check(
        request, lambda body, budget: parse_request(body, max_text_chars=budget)
    )
    if isinstance(parsed, web.Response):
        return parsed
    try:
        outcome = await request.app[_BATCHER].run(
            parsed.texts, [spec.as_json() for spec in parsed.checks]
        )
    except CheckFailed as exc:
        metrics.checks.labels(parsed.stage, exc.code).inc()
        return _json(_STATUS.get(type(exc), 500), error_body(str(exc), exc.code))
    metrics.checks.labels(parsed.stage, "ok").inc()
    metrics.latency.labels(parsed.stage).observe(time.monotonic() - started)
    return web.json_response(outcome)


async def check_bulk(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    started = time.monotonic()
    parsed = await _read_check(
        request, lambda body, budget: parse_bulk_request(body, max_text_chars=budget)
    )
    if isinstance(parsed, web.Response):
        return parsed
    checks = [spec.as_json() for spec in parsed.checks]
    metrics.bulk_size.observe(len(parsed.bodies))
    outcomes = await request.app[_BATCHER].run_bulk([(texts, checks) for texts in parsed.bodies])
    results: list[object] = []
    for outcome in outcomes:
        if isinstance(outcome, CheckFailed):
            metrics.checks.labels(parsed.stage, outcome.code).inc()
            results.append({"error": {"message": str(outcome), "code": outcome.code}})
        else:
            metrics.checks.labels(parsed.stage, "ok").inc()
            results.append(outcome)
    metrics.bulk_latency.labels(parsed.stage).observe(time.monotonic() - started)
    return _json(200, orjson.dumps({"results": results}))


def _authorised(request: web.Request, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


async def health(request: web.Request) -> web.Response:
    pool = request.app[_POOL]
    ready = pool.ready
    body = {"status": "ok" if ready else "unavailable", "workers": ready, "size": pool.size}
    return web.json_response(body, status=200 if ready else 503)


async def metrics_view(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    metrics.ready.set(request.app[_POOL].ready)
    response = web.Response(body=generate_latest(metrics.registry))
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


def _json(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json")


def create_app(settings: ServiceSettings) -> web.Application:
    app = web.Application(client_max_size=settings.max_body_bytes)
    metrics = _Metrics()
    pool = WorkerPool(
        size=settings.workers,
        preload=settings.preload_names(),
        check_timeout_s=settings.check_timeout_s,
        queue_timeout_s=settings.queue_timeout_s,
        on_replaced=lambda why: metrics.replaced.labels(why).inc(),
    )
    app[_METRICS] = metrics
    batcher = Batcher(
        pool,
        window_s=settings.batch_window_s,
        max_size=settings.batch_max,
        on_batch=metrics.batch_size.observe,
    )
    app[_POOL] = pool
    app[_BATCHER] = batcher
    app[_SETTINGS] = settings

    async def lifecycle(app: web.Application) -> object:
        await pool.start(settings.load_timeout_s)
        logger.info("guardrail_service_ready workers=%d port=%d", pool.ready, settings.port)
        yield
        await batcher.close()
        await pool.close()

    app.cleanup_ctx.append(lifecycle)  # type: ignore[arg-type]
    app.router.add_post(CHECK_PATH, check)
    app.router.add_post(CHECK_BULK_PATH, check_bulk)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_get(METRICS_PATH, metrics_view)
    return app


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = ServiceSettings.from_env()
    # aiohttp's run_app stops on SIGINT/SIGTERM: requests in flight finish, then the
    # cleanup context stops the workers.
    web.run_app(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        access_log=None,
        print=None,
        shutdown_timeout=5.0,
        loop=asyncio.new_event_loop(),
    )


if __name__ == "__main__":
    main()
