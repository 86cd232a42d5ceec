"""Detection quality of the worker guardrails on the two labelled sets, before and after.

Every worker detector runs on every prompt of the held-out set
(``tests/guardrails/eval/heldout``: public registry data, never used to choose anything;
docs/guardrails-heldout.md) and of the tuning set (``tests/guardrails/eval/prompts.jsonl``,
written beside the detectors), each with its own ``settings.json``; a prompt's expected
entities per guardrail are in its ``expect`` (absent: none). Precision and recall are counted
over (prompt, entity) pairs, so a PII detector that finds the e-mail but calls the name an
organisation scores one hit, one miss and, if ORGANIZATION were selected, one false alarm.
Latency is one ``check`` call on one text, in one process (no pool, no IPC), after
``Engine()`` has loaded every model.

With ``--baseline REF`` the same probe (bench/guardrails/quality_probe.py) measures REF's
detectors on today's sets first, in the same run, so before and after share the machine's load.

    .venv/bin/python -m bench.guardrails.quality --baseline f0970dc   # measure, write RESULTS.md
    .venv/bin/python -m bench.guardrails.quality --publish            # ... and set the floors

``tests/guardrails/test_quality.py`` recomputes the same figures and fails if any falls below
``eval/published.json``; both score a run with testkit/guardrail_quality.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.baseline import baseline_checkout
from guardrails.engine import Engine
from testkit.guardrail_quality import (
    PUBLISHED,
    SETS,
    TUNING,
    LabelledSet,
    load_prompts,
    load_published,
    load_settings,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "RESULTS.md"
PROBE = Path(__file__).resolve().with_name("quality_probe.py")
SECTION = "## Guardrails — detection quality"

#: the classifiers whose threshold an officer sets, and the thresholds shown for them
SWEEPS: dict[str, tuple[float, ...]] = {
    "prompt_injection": (0.5, 0.9, 0.98, 0.99, 0.999, 0.9999),
    "toxicity": (0.5, 0.7, 0.8, 0.9, 0.95),
}

Measured = dict[str, Any]


def probe(checkout: Path) -> Measured:
    """One checkout's figures on both sets, measured in a child process run from it."""
    argv = [f"{s.name}={s.prompts}:{s.settings}" for s in SETS]
    completed = subprocess.run(
        [sys.executable, str(PROBE), *argv],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    measured: Measured = json.loads(completed.stdout)
    return measured


def precision(figures: Mapping[str, Any]) -> float:
    tp, fp = figures["tp"], figures["fp"]
    return float(tp / (tp + fp)) if tp + fp else 1.0


def recall(figures: Mapping[str, Any]) -> float:
    tp, fn = figures["tp"], figures["fn"]
    return float(tp / (tp + fn)) if tp + fn else 1.0


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def sweep(engine: Engine, name: str, thresholds: Sequence[float]) -> list[tuple[float, ...]]:
    """(threshold, precision, recall) on the tuning set for a classifier's threshold, through
    ``check`` (rule layers included): what an officer trades by moving it."""
    detector: Any = engine.detector(name)
    settings = load_settings(engine, TUNING.settings)[name]
    prompts = load_prompts(TUNING.prompts)
    rows: list[tuple[float, ...]] = []
    for threshold in thresholds:
        chosen = {**settings, "threshold": threshold}
        tp = fp = fn = 0
        for prompt in prompts:
            found = bool(detector.check(prompt["text"], chosen))
            expected = bool(prompt.get("expect", {}).get(name))
            tp, fp, fn = (
                tp + (found and expected),
                fp + (found and not expected),
                fn + (expected and not found),
            )
        rows.append(
            (threshold, tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0)
        )
    return rows


def publish(after: Measured, path: Path = PUBLISHED) -> None:
    """The measured figures become the floors (rounded down to three decimals)."""

    def down(value: float) -> float:
        return int(value * 1000) / 1000

    floors = {
        labelled: {
            name: {"precision": down(precision(f)), "recall": down(recall(f))}
            for name, f in sorted(figures.items())
        }
        for labelled, figures in after["sets"].items()
    }
    document = {
        "about": "Precision and recall floors per guardrail on each labelled set (held-out: "
        "eval/heldout, tuning: prompts.jsonl) with its settings.json; written by "
        "bench/guardrails/quality.py --publish, enforced by test_quality.py.",
        "floors": floors,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _table(labelled: LabelledSet, after: Measured, before: Measured | None) -> str:
    published = load_published(labelled)
    head = "| guardrail | expected | precision | recall | floor (P / R) | p50 ms | p99 ms |"
    rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    if before is not None:
        head = (
            "| guardrail | expected | P before | R before | P after | R after | floor (P / R) "
            "| p50 ms before | p50 ms after | p99 ms after |"
        )
        rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    rows = [head, rule]
    for name, figures in after["sets"][labelled.name].items():
        floor = published.get(name, {})
        lat = figures["latencies"]
        cells = [f"`{name}`", str(figures["tp"] + figures["fn"])]
        if before is not None:
            old = before["sets"][labelled.name][name]
            cells += [f"{precision(old):.3f}", f"{recall(old):.3f}"]
        cells += [
            f"{precision(figures):.3f}",
            f"{recall(figures):.3f}",
            f"{floor.get('precision', 0):.3f} / {floor.get('recall', 0):.3f}",
        ]
        if before is not None:
            cells.append(
                f"{percentile(before['sets'][labelled.name][name]['latencies'], 0.5) * 1000:.2f}"
            )
        cells += [f"{percentile(lat, 0.5) * 1000:.2f}", f"{percentile(lat, 0.99) * 1000:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def section(
    after: Measured,
    before: Measured | None,
    baseline: str | None,
    sweeps: Mapping[str, list[tuple[float, ...]]],
) -> str:
    sizes = {s.name: len(load_prompts(s.prompts)) for s in SETS}
    errors = [
        f"- `{name}`: false alarms {', '.join(f['false_alarms']) or 'none'}; "
        f"misses {', '.join(f['misses']) or 'none'}."
        for name, f in after["sets"][TUNING.name].items()
        if f["false_alarms"] or f["misses"]
    ]
    sweep_rows = [
        f"| `{name}` | {threshold:g} | {p:.3f} | {r:.3f} |"
        for name, rows in sweeps.items()
        for threshold, p, r in rows
    ]
    cpu = platform.processor() or platform.machine()
    compared = (
        f"Before = commit `{baseline}`'s detectors on today's sets, measured in the same run."
        if baseline
        else "No baseline was measured in this run."
    )
    tables = "\n\n".join(
        f"### {s.name} ({sizes[s.name]} prompts)\n\n{_table(s, after, before)}" for s in SETS
    )
    return f"""{SECTION}

Every worker detector on both labelled sets: the **held-out** set
(`tests/guardrails/eval/heldout/`, {sizes["held-out"]} prompts from public registry data: jailbreaks
in the wild, system-prompt extraction, Do-Not-Answer, HarmBench, presidio-evaluator's templates
with fake people of 24 name sets, Debian's fortunes in seven languages, generated secret formats
and Unicode insertions; never used to choose detectors, thresholds or patterns —
[docs/guardrails-heldout.md](../docs/guardrails-heldout.md)) and the **tuning** set
(`tests/guardrails/eval/prompts.jsonl`, {sizes["tuning"]} prompts written beside the detectors).
The published floors are the held-out figures. Precision and recall count (prompt, entity)
pairs: for `pii` and `secrets` the entity name must be right, not only "something found".
Latency: one `check` call on one text in one process, all models loaded, {os.cpu_count()} CPU
cores ({cpu}) shared with other work. {compared} Reproduce with
`.venv/bin/python -m bench.guardrails.quality --baseline REF`; `tests/guardrails/test_quality.py`
fails if precision or recall drops below the floors (`eval/published.json`).

{tables}

Loading every worker detector (`Engine()`) took {after["load_s"]:.1f} s; the measuring process
held {after["rss_mib"][0]:.0f} MiB resident (peak {after["rss_mib"][1]:.0f} MiB) after both sets.

The two classifiers at other thresholds (tuning set, through `check`, rule layers included; the
defaults are `prompt_injection` 0.999 and `toxicity` 0.8):

| guardrail | threshold | precision | recall |
| --- | ---: | ---: | ---: |
{chr(10).join(sweep_rows)}

What the detectors get wrong on the tuning set (prompt id: entity), for whoever tunes them
next (the held-out set's errors are not listed: it is not for tuning):
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--baseline", metavar="REF", help="measure REF's detectors first")
    parser.add_argument("--publish", action="store_true", help="write the floors as measured")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args(argv)
    with baseline_checkout(args.baseline) as checkout:
        before = probe(checkout) if checkout is not None else None
    after = probe(REPO)
    if args.publish:
        publish(after)
    engine = Engine(list(SWEEPS))
    sweeps = {name: sweep(engine, name, ts) for name, ts in SWEEPS.items()}
    text = section(after, before, args.baseline, sweeps)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
