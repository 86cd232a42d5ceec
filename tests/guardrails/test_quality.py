"""Detection quality on the two labelled sets may not fall below the published floors.

The held-out set (docs/guardrails-heldout.md: public registry data nobody here wrote, never used
to choose detectors, thresholds or patterns) carries the published figures; the tuning set,
written beside the detectors, keeps its own floors so a regression on the cases a detector was
built for shows too. The figures are recomputed here exactly as bench/guardrails/quality.py
computes them for bench/RESULTS.md; both read the floors from eval/published.json. A change to
a detector, a library upgrade or a new threshold that loses precision or recall fails this
test; for the tuning set the message lists what the detectors now get wrong, for the held-out
set only the counts (its cases are not for reading while tuning).
"""

from __future__ import annotations

import pytest

from guardrails.catalogue import entries
from guardrails.detectors.pii import DEFAULT_ENTITIES
from testkit.guardrail_quality import (
    HELD_OUT,
    SETS,
    TUNING,
    LabelledSet,
    evaluate,
    load_prompts,
    load_published,
    load_settings,
)

# The first test's setup runs every labelled prompt of both sets through every detector
# (~1,400 prompts; a minute or more on a quiet 2-core machine, longer when five test processes
# share the cores): a bound that stops a hang, not a timing claim.
pytestmark = pytest.mark.timeout(900)

WORKERS = sorted(name for name, entry in entries().items() if entry.runs_on == "worker")


@pytest.fixture(scope="module")
def runs(engine):
    return {
        labelled.name: evaluate(
            engine, load_prompts(labelled.prompts), load_settings(engine, labelled.settings)
        )
        for labelled in SETS
    }


@pytest.mark.parametrize("labelled", SETS, ids=lambda s: s.name)
def test_each_set_covers_every_worker_guardrail(labelled: LabelledSet):
    prompts = load_prompts(labelled.prompts)
    assert len({p["id"] for p in prompts}) == len(prompts)
    assert set(load_published(labelled)) == set(WORKERS)
    for name in WORKERS:
        positives = [p for p in prompts if p.get("expect", {}).get(name)]
        negatives = [p for p in prompts if not p.get("expect", {}).get(name)]
        assert len(positives) >= 3, name
        assert len(negatives) >= 50, name


def test_the_sets_are_large_and_the_tuning_set_covers_every_default_pii_entity():
    assert len(load_prompts(TUNING.prompts)) >= 200
    held_out = load_prompts(HELD_OUT.prompts)
    assert len(held_out) >= 500
    assert {p["id"] for p in held_out}.isdisjoint({p["id"] for p in load_prompts(TUNING.prompts)})
    expected = {e for p in load_prompts(TUNING.prompts) for e in p.get("expect", {}).get("pii", ())}
    assert set(DEFAULT_ENTITIES) <= expected


@pytest.mark.parametrize("labelled", SETS, ids=lambda s: s.name)
@pytest.mark.parametrize("guardrail", WORKERS)
def test_precision_and_recall_hold_the_published_floors(runs, labelled, guardrail):
    floor = load_published(labelled)[guardrail]
    score = runs[labelled.name].scores[guardrail]
    if labelled is TUNING:
        errors = f"false alarms {score.false_alarms}; misses {score.misses}"
    else:
        errors = f"{score.fp} false alarms, {score.fn} misses (held-out: counts only)"
    # Plain numbers in the assertions: pytest spells out every operand of a failing assert,
    # and the score's own repr would list the held-out set's cases.
    precision, recall = float(score.precision), float(score.recall)
    assert precision >= floor["precision"], f"{guardrail} precision fell: {errors}"
    assert recall >= floor["recall"], f"{guardrail} recall fell: {errors}"
