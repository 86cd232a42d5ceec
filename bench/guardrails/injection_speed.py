"""The prompt-injection check on one core: the reference path against the one-pass path.

    .venv/bin/python -m bench.guardrails.injection_speed [--n 200] [--out FILE]

In this one process, after ``load()`` (which sets ``torch.set_num_threads(1)``, as in a
guardrail worker): ``PromptInjectionDetector._reference_score`` (one unpadded forward per
reading, as before issue 26) and ``score`` (every reading in one packed, masked pass, see
guardrails/detectors/injection_model.py), on prompts of about 256 B, 1 KB and 4 KB. The prompts
are the evaluation set's own (tests/guardrails/eval/prompts.jsonl), benign and injection
interleaved three to one and joined until the size is reached; 20 different texts per size,
taken in turn. The two paths alternate call by call, so that other load on the host falls on
both alike. Prints a markdown table (and ``--out`` writes it), with the largest difference
between the two paths' scores on the texts measured.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from guardrails.detectors.injection import PromptInjectionDetector
from testkit.guardrail_quality import load_prompts

SIZES = {"256 B": 256, "1 KB": 1024, "4 KB": 4096}
TEXTS_PER_SIZE = 20


def texts(size: int, count: int = TEXTS_PER_SIZE) -> list[str]:
    """``count`` texts of at most ``size`` UTF-8 bytes (at least ``size`` - 4), each the
    evaluation set's prompts joined from a different starting point."""
    prompts = load_prompts()
    injection = [p["text"] for p in prompts if p.get("expect", {}).get("prompt_injection")]
    benign = [p["text"] for p in prompts if not p.get("expect", {}).get("prompt_injection")]
    pool: list[str] = []
    for i, text in enumerate(benign):
        pool.append(text)
        if i % 3 == 2:
            pool.append(injection[(i // 3) % len(injection)])
    result = []
    for j in range(count):
        parts: list[str] = []
        i = j * 11
        while len(" ".join(parts).encode()) < size:
            parts.append(pool[i % len(pool)])
            i += 1
        data = " ".join(parts).encode()[:size]
        result.append(data.decode(errors="ignore"))
    return result


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure(
    detector: PromptInjectionDetector, samples: list[str], n: int
) -> dict[str, list[float]]:
    """Seconds per call of each path, ``n`` calls each, alternating which goes first."""
    paths: dict[str, Callable[[str], float]] = {
        "reference": detector._reference_score,
        "fast": detector.score,
    }
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():  # warm up both on this size
        path(samples[0])
    for i in range(n):
        text = samples[i % len(samples)]
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        for name in order:
            started = time.perf_counter()
            paths[name](text)
            seconds[name].append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="calls per path and size")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    detector = PromptInjectionDetector()
    detector.load()
    lines = [
        f"Prompt-injection check, one core (torch threads: {torch.get_num_threads()}), "
        f"{args.n} calls per path and size, in-process:",
        "",
        "| prompt | tokens | readings | reference p50 | reference p95 | fast p50 | fast p95 "
        "| p50 speed-up | max score diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, size in SIZES.items():
        samples = texts(size)
        readings = [detector._windows(t) for t in samples]
        tokens = statistics.median(len(detector._tokenizer.enc.encode_ordinary(t)) for t in samples)
        count = statistics.median(len(r) for r in readings)
        diff = max(abs(detector.score(t) - detector._reference_score(t)) for t in samples)
        seconds = measure(detector, samples, args.n)
        ref, fast = seconds["reference"], seconds["fast"]
        lines.append(
            f"| {label} | {tokens:.0f} | {count:.0f} "
            f"| {_ms(statistics.median(ref))} | {_ms(_percentile(ref, 95))} "
            f"| {_ms(statistics.median(fast))} | {_ms(_percentile(fast, 95))} "
            f"| {statistics.median(ref) / statistics.median(fast):.2f}× | {diff:.1e} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "tokens: the text's own (median over the 20 texts of a size); readings: its windows "
        "and passages, each a forward pass on the reference path and all one pass on the fast "
        "one; max score diff: the largest |fast − reference| over those texts.",
    ]
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


if __name__ == "__main__":
    main()
