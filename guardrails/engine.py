"""Runs a stage's selected checks over a request's or a response's texts: what the guardrail
workers execute. Synchronous and CPU-bound by design — never call it on an event loop.

Order: the selections as given (governance orders them); a ``block`` finding stops the run;
a ``redact`` rewrites the texts the next checks see; a ``flag`` only records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from guardrails.base import Detector, Finding
from guardrails.catalogue import detector_for, entries


@dataclass(frozen=True, slots=True)
class Check:
    """One selection as the worker runs it (stage already chosen)."""

    guardrail: str
    action: str  # block | redact | flag
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Summary:
    """What is recorded of one guardrail's findings: never the text."""

    guardrail: str
    action: str  # what was done: blocked | redacted | flagged
    entities: dict[str, int]
    score: float


@dataclass(slots=True)
class Outcome:
    texts: list[str]
    findings: list[Summary]
    blocked: Summary | None = None

    def as_json(self) -> dict[str, Any]:
        def summary(s: Summary) -> dict[str, Any]:
            return {
                "guardrail": s.guardrail,
                "action": s.action,
                "entities": s.entities,
                "score": s.score,
            }

        return {
            "texts": self.texts,
            "findings": [summary(s) for s in self.findings],
            "blocked": summary(self.blocked) if self.blocked else None,
        }


_PAST = {"block": "blocked", "redact": "redacted", "flag": "flagged"}


class Engine:
    """The detectors of one worker process, loaded once."""

    def __init__(self, names: Sequence[str] | None = None) -> None:
        self._detectors: dict[str, Detector] = {}
        for name in names if names is not None else _worker_names():
            self.detector(name)

    def detector(self, name: str) -> Detector:
        detector = self._detectors.get(name)
        if detector is None:
            detector = detector_for(name)
            detector.load()
            self._detectors[name] = detector
        return detector

    def run(self, texts: Sequence[str], checks: Sequence[Check]) -> Outcome:
        current = list(texts)
        outcome = Outcome(texts=current, findings=[])
        for check in checks:
            detector = self.detector(check.guardrail)
            found: list[tuple[int, Finding]]
            if getattr(detector, "whole_prompt", False):
                # A limit on the prompt as a whole (its spans, if any, are not per text).
                joined = "\n".join(text for text in current if text)
                found = [
                    (-1, replace(finding, start=None, end=None))
                    for finding in (detector.check(joined, check.settings) if joined else ())
                ]
            else:
                found = [
                    (index, finding)
                    for index, text in enumerate(current)
                    if text
                    for finding in detector.check(text, check.settings)
                ]
            if not found:
                continue
            summary = Summary(
                guardrail=check.guardrail,
                action=_PAST[check.action],
                entities=dict(Counter(finding.entity for _, finding in found)),
                score=max(finding.score for _, finding in found),
            )
            outcome.findings.append(summary)
            if check.action == "block":
                outcome.blocked = summary
                return outcome
            if check.action == "redact":
                for index in {index for index, _ in found if index >= 0}:
                    current[index] = redact(current[index], [f for i, f in found if i == index])
        return outcome


def redact(text: str, findings: Sequence[Finding]) -> str:
    """Each span replaced by ``<ENTITY>``; overlapping spans merge (the first entity names
    the merged span). Findings without a span leave the text alone."""
    spans = sorted(
        (f.start, f.end, f.entity) for f in findings if f.start is not None and f.end is not None
    )
    merged: list[list[Any]] = []
    for start, end, entity in spans:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end, entity])
    pieces, at = [], 0
    for start, end, entity in merged:
        pieces.append(text[at:start])
        pieces.append(f"<{entity}>")
        at = end
    pieces.append(text[at:])
    return "".join(pieces)


def _worker_names() -> list[str]:
    return [name for name, entry in entries().items() if entry.runs_on == "worker"]
