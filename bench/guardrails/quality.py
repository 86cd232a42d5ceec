"""Detection quality of the worker guardrails on the labelled evaluation set.

Every worker detector runs on every prompt of ``tests/guardrails/eval/prompts.jsonl`` with the
settings in ``eval/settings.json``; a prompt's expected entities per guardrail are in its
``expect`` (absent: none). Precision and recall are counted over (prompt, entity) pairs, so a
PII detector that finds the e-mail but calls the name an organisation scores one hit, one miss
and, if ORGANIZATION were selected, one false alarm. Latency is one ``check`` call on one text,
in this one process (no pool, no IPC), after ``Engine()`` has loaded every model.

    .venv/bin/python -m bench.guardrails.quality            # measure, write bench/RESULTS.md
    .venv/bin/python -m bench.guardrails.quality --publish  # ... and raise the published floors

``tests/guardrails/test_quality.py`` recomputes the same figures and fails if any falls below
``eval/published.json``; both score a run with testkit/guardrail_quality.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from guardrails.engine import Engine
from testkit.guardrail_quality import (
    PUBLISHED,
    Run,
    evaluate,
    load_prompts,
    load_published,
    load_settings,
)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "RESULTS.md"
SECTION = "## Guardrails — detection quality"

#: the classifiers whose one score a threshold cuts, and the thresholds shown for them
SWEEPS: dict[str, tuple[float, ...]] = {
    "prompt_injection": (0.5, 0.9, 0.98, 0.99, 0.999, 0.9999),
    "toxicity": (0.5, 0.7, 0.8, 0.9, 0.95),
}


def sweep(
    engine: Engine, prompts: Sequence[Mapping[str, Any]], name: str, thresholds: Sequence[float]
) -> list[tuple[float, float, float]]:
    """(threshold, precision, recall) for a classifier's threshold: what an officer trades."""
    detector: Any = engine.detector(name)
    scored = [(detector.score(p["text"]), bool(p.get("expect", {}).get(name))) for p in prompts]
    rows = []
    for threshold in thresholds:
        tp = sum(1 for s, y in scored if y and s >= threshold)
        fp = sum(1 for s, y in scored if not y and s >= threshold)
        fn = sum(1 for s, y in scored if y and s < threshold)
        rows.append(
            (threshold, tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0)
        )
    return rows


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def publish(run: Run, path: Path = PUBLISHED) -> None:
    """The measured figures become the floors (rounded down to three decimals)."""

    def down(value: float) -> float:
        return int(value * 1000) / 1000

    floors = {
        name: {"precision": down(s.precision), "recall": down(s.recall)}
        for name, s in sorted(run.scores.items())
    }
    document = {
        "about": "Precision and recall floors per guardrail on prompts.jsonl with settings.json;"
        " written by bench/guardrails/quality.py --publish, enforced by test_quality.py.",
        "floors": floors,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def rss_mib() -> tuple[float, float]:
    """This process's resident memory now and at its peak (MiB), from /proc."""
    status = Path("/proc/self/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.MULTILINE))
    return int(found["VmRSS"]) / 1024, int(found["VmHWM"]) / 1024


def section(
    run: Run,
    prompts: Sequence[Mapping[str, Any]],
    load_s: float,
    rss: tuple[float, float],
    sweeps: Mapping[str, list[tuple[float, float, float]]],
) -> str:
    published = load_published()
    groups: dict[str, int] = {}
    for prompt in prompts:
        group = prompt["id"].rsplit("-", 1)[0]
        groups[group] = groups.get(group, 0) + 1
    rows = []
    for name, score in run.scores.items():
        floor = published.get(name, {})
        lat = run.latencies[name]
        rows.append(
            f"| `{name}` | {score.tp + score.fn} | {score.precision:.3f} | {score.recall:.3f} "
            f"| {floor.get('precision', 0):.3f} / {floor.get('recall', 0):.3f} "
            f"| {percentile(lat, 0.5) * 1000:.2f} | {percentile(lat, 0.99) * 1000:.2f} |"
        )
    errors = []
    for name, score in run.scores.items():
        if score.false_alarms or score.misses:
            errors.append(
                f"- `{name}`: false alarms {', '.join(score.false_alarms) or 'none'}; "
                f"misses {', '.join(score.misses) or 'none'}."
            )
    sweep_rows = [
        f"| `{name}` | {threshold:g} | {precision:.3f} | {recall:.3f} |"
        for name, rows in sweeps.items()
        for threshold, precision, recall in rows
    ]
    cpu = platform.processor() or platform.machine()
    return f"""{SECTION}

Every worker detector on the labelled evaluation set `tests/guardrails/eval/prompts.jsonl`
({len(prompts)} prompts written for this: {", ".join(f"{g} {n}" for g, n in groups.items())};
the `-lookalike` groups are benign texts that resemble the positives), with the settings in
`eval/settings.json` (defaults, plus an `EMPLOYEE_ID` custom pattern for `pii`, `allowed: [en]`
for `language`, two banned phrases, `max_tokens: 300`). Precision and recall count
(prompt, entity) pairs: for `pii` the entity type must be right, not only "something found".
Latency: one `check` call on one text in one process, all models loaded, {os.cpu_count()} CPU
cores ({cpu}) shared with other work. Reproduce with `.venv/bin/python -m bench.guardrails.quality`;
`tests/guardrails/test_quality.py` fails if precision or recall drops below the published
floors (`eval/published.json`).

| guardrail | expected entities | precision | recall | published floor (P / R) | p50 ms | p99 ms |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

Loading every worker detector (`Engine()`: Presidio + spaCy, detect-secrets, NanoGuard on
torch, alt-profanity-check, langid, tiktoken) took {load_s:.1f} s; one loaded worker process
holds {rss[0]:.0f} MiB resident (peak {rss[1]:.0f} MiB) after the run.

The two classifiers at other thresholds (same set; the defaults are
`prompt_injection` 0.999 and `toxicity` 0.8):

| guardrail | threshold | precision | recall |
| --- | ---: | ---: | ---: |
{chr(10).join(sweep_rows)}

What the detectors got wrong (prompt id: entity), for whoever tunes them next:
{chr(10).join(errors) or "- nothing."}

Measured {datetime.date.today().isoformat()}.
"""


def write_section(text: str, path: Path = RESULTS) -> None:
    """Replace this section of RESULTS.md (or append it), leaving every other one alone."""
    document = path.read_text(encoding="utf-8")
    start = document.find(SECTION)
    if start < 0:
        document = document.rstrip("\n") + "\n\n" + text
    else:
        following = document.find("\n## ", start + len(SECTION))
        rest = document[following + 1 :] if following >= 0 else ""
        document = document[:start] + text + ("\n" + rest if rest else "")
    path.write_text(document, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publish", action="store_true", help="write the floors as measured")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    engine = Engine()
    load_s = time.perf_counter() - started
    prompts = load_prompts()
    run = evaluate(engine, prompts, load_settings(engine))
    if args.publish:
        publish(run)
    rss = rss_mib()
    sweeps = {name: sweep(engine, prompts, name, ts) for name, ts in SWEEPS.items()}
    text = section(run, prompts, load_s, rss, sweeps)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
