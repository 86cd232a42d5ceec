"""The guardrails' detection-quality evaluation: the two labelled sets (tests/guardrails/eval:
the tuning set and the held-out set), the settings each runs with, the published floors, and
how a run is scored. The quality test holds the detectors to the floors; the quality
benchmark measures and publishes them.

Precision and recall are counted over (prompt, entity) pairs, so a PII detector that finds the
e-mail but calls the name an organisation scores one hit, one miss and, if ORGANIZATION were
selected, one false alarm.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardrails.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "tests" / "guardrails" / "eval"
PROMPTS = EVAL / "prompts.jsonl"
SETTINGS = EVAL / "settings.json"
PUBLISHED = EVAL / "published.json"
HELDOUT = EVAL / "heldout"


@dataclass(frozen=True)
class LabelledSet:
    """A labelled set and the settings it runs with. ``tuning`` is the set detectors, patterns
    and thresholds are chosen on; ``held-out`` only measures them (docs/guardrails-heldout.md)."""

    name: str
    prompts: Path
    settings: Path


TUNING = LabelledSet("tuning", PROMPTS, SETTINGS)
HELD_OUT = LabelledSet("held-out", HELDOUT / "prompts.jsonl", HELDOUT / "settings.json")
SETS = (HELD_OUT, TUNING)


@dataclass
class Score:
    guardrail: str
    tp: int = 0
    fp: int = 0
    fn: int = 0
    #: "id: entity" of each false alarm and each miss, for reading the errors
    false_alarms: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


@dataclass
class Run:
    scores: dict[str, Score]
    #: guardrail → seconds per check call, one per prompt
    latencies: dict[str, list[float]]


def load_prompts(path: Path = PROMPTS) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_settings(engine: Engine, path: Path = SETTINGS) -> dict[str, dict[str, Any]]:
    """The evaluation's settings per guardrail, completed by each detector's ``validate``."""
    raw: dict[str, dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return {name: engine.detector(name).validate(settings) for name, settings in raw.items()}


def evaluate(
    engine: Engine,
    prompts: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Mapping[str, Any]],
) -> Run:
    scores = {name: Score(name) for name in settings}
    latencies: dict[str, list[float]] = {name: [] for name in settings}
    for prompt in prompts:
        text = prompt["text"]
        for name, selected in settings.items():
            detector = engine.detector(name)
            started = time.perf_counter()
            findings = detector.check(text, selected)
            latencies[name].append(time.perf_counter() - started)
            found = {f.entity for f in findings}
            expected = set(prompt.get("expect", {}).get(name, ()))
            score = scores[name]
            score.tp += len(found & expected)
            score.fp += len(found - expected)
            score.fn += len(expected - found)
            score.false_alarms += [f"{prompt['id']}: {e}" for e in sorted(found - expected)]
            score.misses += [f"{prompt['id']}: {e}" for e in sorted(expected - found)]
    return Run(scores, latencies)


def load_published(
    labelled: LabelledSet = HELD_OUT, path: Path = PUBLISHED
) -> dict[str, dict[str, float]]:
    """The floors published for one set: guardrail → {precision, recall}."""
    document = json.loads(path.read_text(encoding="utf-8"))
    floors: dict[str, dict[str, float]] = document["floors"][labelled.name]
    return floors
