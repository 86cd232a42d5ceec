"""The prompt-injection check on one core: the shipped path against the float32 reference.

    .venv/bin/python -m bench.guardrails.injection_speed [--n 40] [--no-write]

In this one process, after ``load()`` (one thread for torch and for ONNX Runtime, as in a
guardrail worker), on prompts of about 256 B, 1 KB and 4 KB of two kinds, 20 texts per size
and kind, taken in turn:

- *mixed*: the tuning set's prompts (tests/guardrails/eval/prompts.jsonl), benign and injection
  interleaved three to one and joined until the size is reached, as issue 26 measured;
- *benign*: its benign prompts alone, joined the same way. Most of these pass the rule layer
  and reach the classifier, so they are the check's costly case.

The first table times ``check`` (the rule layer, then the classifier) both ways, the calls
alternating so that other load on the host falls on both alike: *reference* is the rule layer
then ``_reference_score`` (every reading of the text, one unpadded float32 torch forward each,
the path before issue 26); *shipped* is ``check`` as it runs in a worker (the whole text's
windows and the passages that address a model, read in int8 ONNX Runtime and again in float32
only near the threshold), over all 20 texts and over those the rule layer leaves to the
classifier. The second times the classifier alone on the mixed texts, one way at a time: every
reading in torch one by one (the reference), in torch in one padded pass, in ONNX Runtime
float32 and int8; the shipped readings; and fewer (passages only). The last lines compare
decisions, the shipped check against the reference check on the tuning set, and how far int8
moved a reading's log-odds from float32's (what ``_INT8_SLACK`` in injection.py must exceed).
Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.results import write_section
from guardrails.detectors import injection_rules
from guardrails.detectors.injection import (
    _INT8_SLACK,
    DEFAULT_THRESHOLD,
    PromptInjectionDetector,
    _margins,
)
from guardrails.detectors.injection_model import _Padded, batches
from testkit.guardrail_quality import load_prompts

SECTION = "## Guardrails — injection check speed"
ORT_VERSION = importlib.metadata.version("onnxruntime")
SIZES = {"256 B": 256, "1 KB": 1024, "4 KB": 4096}
TEXTS_PER_SIZE = 20


def texts(size: int, count: int = TEXTS_PER_SIZE, *, benign_only: bool = False) -> list[str]:
    """``count`` texts of at most ``size`` UTF-8 bytes (at least ``size`` - 4), each the
    tuning set's prompts joined from a different starting point."""
    prompts = load_prompts()
    injection = [p["text"] for p in prompts if p.get("expect", {}).get("prompt_injection")]
    benign = [p["text"] for p in prompts if not p.get("expect", {}).get("prompt_injection")]
    pool: list[str] = []
    for i, text in enumerate(benign):
        pool.append(text)
        if i % 3 == 2 and not benign_only:
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
    paths: dict[str, Callable[[str], object]], samples: list[str], n: int
) -> dict[str, list[float]]:
    """Seconds per call of each path, ``n`` calls each, the paths taking turns call by call
    (their order reversed every other call)."""
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():  # warm up each on this size
        path(samples[0])
    for i in range(n):
        text = samples[i % len(samples)]
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        for name in order:
            started = time.perf_counter()
            paths[name](text)
            seconds[name].append(time.perf_counter() - started)
    return seconds


class Variants:
    """The classifier read every way measured, on all of a text's readings."""

    def __init__(self, detector: PromptInjectionDetector) -> None:
        self.detector = detector
        self.padded = _Padded(detector._models.model).eval()

    def decides(self, text: str) -> bool:
        """The reference check's decision: the rule layer, then the reference score."""
        shape, worth_reading = injection_rules.screen(text)
        if shape is not None:
            return True
        return worth_reading and self.detector._reference_score(text) >= DEFAULT_THRESHOLD

    def torch_padded(self, text: str) -> float:
        """The exported module run in torch, in the same padded batches as ONNX Runtime."""
        best = 0.0
        with torch.inference_mode():
            for _rows, ids, mask in batches(self.detector._windows(text)):
                logits = self.padded(torch.from_numpy(ids), torch.from_numpy(mask))
                best = max(best, float(torch.softmax(logits, -1)[:, 1].max()))
        return best

    def passages_only(self, text: str, threshold: float) -> float | None:
        """The shipped cascade without the whole-text windows of a text over 128 tokens: the
        passages that address a model only (the variant that lost held-out recall)."""
        readings = self.detector._readings(text)
        short = len(readings[0].tokens) <= 129
        chosen = [r.tokens for r in readings if r.addressed or (r.window and short)]
        return self.detector._decide(chosen, threshold)

    def int8(self, text: str) -> float:
        margins = _margins(self.detector._models.int8.logits(self.detector._windows(text)))
        return float(1 / (1 + np.exp(-margins.max())))

    def int8_error(self, text: str) -> float:
        """The most int8 moves a reading's log-odds from float32's, over the text's readings."""
        models = self.detector._models
        readings = self.detector._windows(text)
        float32 = np.concatenate([_margins(models.float32.logits([r])) for r in readings])
        return float(np.abs(_margins(models.int8.logits(readings)) - float32).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="calls per path, size and kind")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    detector = PromptInjectionDetector()
    started = time.perf_counter()
    detector.load()
    load_s = time.perf_counter() - started
    variants = Variants(detector)
    settings = detector.validate({})
    threshold = settings["threshold"]
    check_lines = [
        "| prompt | kind | classifier reads | reference p50 | reference p95 | shipped p50 "
        "| shipped p95 | p50 speed-up | shipped p50, texts the classifier reads "
        "| found by reference only / shipped only |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    measured_texts: list[str] = []
    for label, size in SIZES.items():
        for kind in ("mixed", "benign"):
            samples = texts(size, benign_only=kind == "benign")
            measured_texts += samples
            read = [t for t in samples if injection_rules.screen(t)[1]]
            reference = [variants.decides(t) for t in samples]
            shipped = [bool(detector.check(t, settings)) for t in samples]
            only_reference = sum(r and not s for r, s in zip(reference, shipped, strict=True))
            only_shipped = sum(s and not r for r, s in zip(reference, shipped, strict=True))
            seconds = measure(
                {
                    "reference": variants.decides,
                    "shipped": lambda t: detector.check(t, settings),
                },
                samples,
                args.n,
            )
            ref, fast = seconds["reference"], seconds["shipped"]
            if read:
                reads = measure({"shipped": lambda t: detector.check(t, settings)}, read, args.n)
                read_p50 = _ms(statistics.median(reads["shipped"]))
            else:
                read_p50 = "—"
            check_lines.append(
                f"| {label} | {kind} | {len(read)}/{len(samples)} "
                f"| {_ms(statistics.median(ref))} | {_ms(_percentile(ref, 95))} "
                f"| {_ms(statistics.median(fast))} | {_ms(_percentile(fast, 95))} "
                f"| {statistics.median(ref) / statistics.median(fast):,.1f}× | {read_p50} "
                f"| {only_reference} / {only_shipped} |"
            )
            print(check_lines[-1], flush=True)

    classifier_lines = [
        "| prompt | tokens | readings (screened) | torch one by one (reference) "
        "| torch, one padded pass | ORT float32 | ORT int8 | shipped: screened, int8 + float32 "
        "| passages only, int8 + float32 | max \\|Δ log-odds\\| int8 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    paths: dict[str, Callable[[str], object]] = {
        "reference": detector._reference_score,
        "torch padded": variants.torch_padded,
        "ORT float32": detector.score,
        "ORT int8": variants.int8,
        "screened": lambda t: detector._screened_score(t, threshold),
        "passages only": lambda t: variants.passages_only(t, threshold),
    }
    for label, size in SIZES.items():
        samples = texts(size)
        readings = [detector._readings(t) for t in samples]
        tokens = statistics.median(len(detector._tokenizer.enc.encode_ordinary(t)) for t in samples)
        count = statistics.median(len(r) for r in readings)
        screened = statistics.median(sum(x.screened for x in r) for r in readings)
        error = max(variants.int8_error(t) for t in samples)
        p50 = {}
        for name, path in paths.items():  # one at a time: the reference alone takes minutes
            p50[name] = statistics.median(
                measure({name: path}, samples, max(args.n // 2, 10))[name]
            )
        classifier_lines.append(
            f"| {label} | {tokens:.0f} | {count:.0f} ({screened:.0f}) | "
            + " | ".join(_ms(p50[name]) for name in paths)
            + f" | {error:.2f} |"
        )
        print(classifier_lines[-1], flush=True)

    tuning = [p["text"] for p in load_prompts()]
    tuning_differ = sum(variants.decides(t) != bool(detector.check(t, settings)) for t in tuning)
    tuning_error = max(variants.int8_error(t) for t in tuning)
    fp32_error = max(
        abs(detector.score(t) - detector._reference_score(t)) for t in tuning + measured_texts[:40]
    )
    now = datetime.datetime.now(datetime.UTC)
    text = "\n".join(
        [
            SECTION,
            "",
            "Issue 26: the injection check at ≤ 15 ms p50 on a 1 KB prompt on this 2-core "
            "machine. Reproduce with `.venv/bin/python -m bench.guardrails.injection_speed`; "
            f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} and ONNX "
            f"Runtime {ORT_VERSION} on one thread each, {args.n} calls per path and row; "
            f"loading the detector took {load_s:.1f} s; {now:%Y-%m-%d %H:%M} UTC.",
            "",
            "The check, rule layer included (p50 and p95 of one `check` call over all 20 texts; "
            "*classifier reads*: the texts the rule layer leaves to the classifier, and the "
            "shipped p50 on those alone; the last column: texts one way finds an injection in "
            "and the other does not):",
            "",
            *check_lines,
            "",
            "The classifier alone on the mixed texts, every reading (p50 of one call; readings: "
            "the text's windows and passages, in brackets those the shipped path reads; the last "
            "column: the most int8 moved one reading's log-odds from float32's). *Passages only* "
            "is the shipped cascade without the whole text's windows beyond 128 tokens: faster, "
            "but it took the held-out set's injection recall from 0.935 to 0.887 "
            "(tests/guardrails/test_quality.py), so it is not shipped:",
            "",
            *classifier_lines,
            "",
            f"On the tuning set ({len(tuning)} prompts), the shipped check and the reference check "
            f"differ on {tuning_differ}; int8 moved a reading's log-odds by {tuning_error:.2f} "
            f"at most (the slack kept for it: {_INT8_SLACK}); ORT float32's score differs from "
            f"the reference's by {fp32_error:.1e} at most (tuning set and 40 of the texts above).",
            "",
            "Reading it: the model costs ~25 MFLOP per token it reads, whatever the runtime; "
            "ONNX Runtime float32 is ~2.5× torch's, int8 another ~2×, and int8's verdicts "
            "far from the threshold are kept, so float32 reads little. The rule layer decides "
            "every mixed 1 KB prompt (each holds an attack's shape), so there the check costs a "
            "fraction of a millisecond. A 1 KB prompt the classifier must read costs its whole "
            "text once in int8 (~420 tokens) plus the passages that address a model; the "
            "whole-text reading is what keeps the held-out recall, and it alone is more than "
            "15 ms on one core of this host. Figures are from a shared 2-core host with other "
            "jobs running: the ratios hold, the absolute times are high and noisy.",
        ]
    )
    print()
    print(text)
    if not args.no_write:
        write_section(SECTION, text + "\n")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


if __name__ == "__main__":
    main()
