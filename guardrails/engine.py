"""Runs a stage's selected checks over a request's or a response's texts: what the guardrail
workers execute. Synchronous and CPU-bound by design — never call it on an event loop.

Order: the selections as given (governance orders them); a ``block`` finding stops the run;
a ``redact`` rewrites the texts the next checks see; a ``flag`` only records.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

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


logger = logging.getLogger("guardrails.engine")
_PAST = {"block": "blocked", "redact": "redacted", "flag": "flagged"}


class Engine:
    """The detectors of one worker process, loaded once."""

    def __init__(
        self,
        names: Sequence[str] | None = None,
        *,
        detectors: Mapping[str, Detector] | None = None,
    ) -> None:
        """Loads ``names`` (default: every worker-run detector in the catalogue);
        ``detectors``: instances already made and loaded, by name (a test's own)."""
        self._detectors: dict[str, Detector] = dict(detectors or {})
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
        """One request's checks; a detector's exception propagates."""
        result = self.run_many([(texts, checks)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def run_many(self, jobs: Sequence[Job]) -> list[Outcome | Exception]:
        """Several requests' checks at once (a guardrail service batch), each answered exactly
        as ``run`` would answer it alone: its own texts, its own checks in its own order, its
        redactions seen only by its own later checks. An exception is that request's answer,
        never its neighbours'.

        The requests advance in lockstep, one check each per round, so that where a detector
        has the optional ``check_many(texts, settings) -> [findings, …]`` (one list per text:
        a model scoring many texts in one pass), the requests whose next check is that
        detector under the same settings share one call; a detector without it is called text
        by text as in ``run``."""
        runs = [
            _Run(list(checks), Outcome(texts=list(texts), findings=[])) for texts, checks in jobs
        ]
        while pending := [run for run in runs if run.pending]:
            groups: dict[tuple[str, str], list[_Run]] = {}
            for index, run in enumerate(pending):
                check = run.next
                try:
                    detector = self.detector(check.guardrail)
                except Exception as exc:
                    run.error = exc
                    continue
                key = (check.guardrail, _settings_key(check.settings))
                if getattr(detector, "check_many", None) is None:
                    key = (check.guardrail, f"#{index}")  # nothing to share: one run alone
                groups.setdefault(key, []).append(run)
            for (name, _), group in groups.items():
                self._step(self._detectors[name], group)
        return [run.error if run.error is not None else run.outcome for run in runs]

    def _step(self, detector: Detector, group: list[_Run]) -> None:
        """Each run's next check (the same detector and settings for all of ``group``)."""
        inputs = [(run, _inputs(detector, run.outcome.texts)) for run in group]
        check_many = getattr(detector, "check_many", None)
        if check_many is not None:
            flat = [text for _, items in inputs for _, text in items]
            try:
                answers = list(check_many(flat, group[0].next.settings)) if flat else []
                if len(answers) != len(flat):
                    raise ValueError("check_many answered a different number of texts")
            except Exception:
                # Find out, text by text, which request the failure belongs to.
                logger.warning("check_many_failed guardrail=%s", group[0].next.guardrail)
            else:
                at = 0
                for run, items in inputs:
                    found = [
                        (index, finding)
                        for (index, _), findings in zip(
                            items, answers[at : at + len(items)], strict=True
                        )
                        for finding in findings
                    ]
                    at += len(items)
                    run.apply(_whole(detector, found))
                return
        for run, items in inputs:
            try:
                found = [
                    (index, finding)
                    for index, text in items
                    for finding in detector.check(text, run.next.settings)
                ]
            except Exception as exc:
                run.error = exc
                continue
            run.apply(_whole(detector, found))


Job = tuple[Sequence[str], Sequence[Check]]  # one request: its texts and its checks


@dataclass(slots=True)
class _Run:
    """One request in ``Engine.run_many``: its checks, how far it got, what it has so far."""

    checks: list[Check]
    outcome: Outcome
    at: int = 0
    error: Exception | None = None

    @property
    def pending(self) -> bool:
        return self.error is None and self.outcome.blocked is None and self.at < len(self.checks)

    @property
    def next(self) -> Check:
        return self.checks[self.at]

    def apply(self, found: list[tuple[int, Finding]]) -> None:
        """The next check's findings (``-1``: the prompt as a whole): a block stops the run,
        a redact rewrites the texts the later checks see, a flag only records."""
        check = self.next
        self.at += 1
        if not found:
            return
        summary = Summary(
            guardrail=check.guardrail,
            action=_PAST[check.action],
            entities=dict(Counter(finding.entity for _, finding in found)),
            score=max(finding.score for _, finding in found),
        )
        self.outcome.findings.append(summary)
        if check.action == "block":
            self.outcome.blocked = summary
        elif check.action == "redact":
            current = self.outcome.texts
            for index in {index for index, _ in found if index >= 0}:
                current[index] = redact(current[index], [f for i, f in found if i == index])


def _inputs(detector: Detector, texts: list[str]) -> list[tuple[int, str]]:
    """What the detector reads: each non-empty text with its index, or, for a limit on the
    prompt as a whole, the texts joined (index ``-1``)."""
    if getattr(detector, "whole_prompt", False):
        joined = "\n".join(text for text in texts if text)
        return [(-1, joined)] if joined else []
    return [(index, text) for index, text in enumerate(texts) if text]


def _whole(detector: Detector, found: list[tuple[int, Finding]]) -> list[tuple[int, Finding]]:
    """A whole-prompt detector's spans are not per text: dropped."""
    if getattr(detector, "whole_prompt", False):
        return [(index, replace(finding, start=None, end=None)) for index, finding in found]
    return found


def _settings_key(settings: Mapping[str, Any]) -> str:
    """Settings as a grouping key: requests share a ``check_many`` call only under equal ones."""
    try:
        return orjson.dumps(settings, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(sorted(settings.items(), key=lambda item: str(item[0])))


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
