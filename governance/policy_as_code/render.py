"""A plan, for people (a readable list of changes) and for CI (JSON)."""

from __future__ import annotations

import json
from typing import Any

from governance.policy_as_code.errors import Problem
from governance.policy_as_code.plan import Action, Change, Plan

_SIGNS = {
    Action.CREATE: "+",
    Action.UPDATE: "~",
    Action.DELETE: "-",
    Action.RETIRE: "-",
    Action.MINT: "*",
}
_LONGEST_VALUE = 100


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _LONGEST_VALUE else text[: _LONGEST_VALUE - 1] + "…"


def _change_lines(change: Change) -> list[str]:
    lines = [f"  {_SIGNS[change.action]} {change.action.value:<7} {change.path}"]
    for item in change.fields:
        if change.action is Action.CREATE:
            if item.after not in (None, "", [], {}):  # a new record's defaults say nothing
                lines.append(f"        {item.name}: {_show(item.after)}")
        elif change.action is Action.DELETE:
            continue  # what is deleted is in the database; the path says which
        else:
            lines.append(f"        {item.name}: {_show(item.before)} → {_show(item.after)}")
    if change.transitions:
        lines.append(f"        lifecycle: {' → '.join(change.transitions)}")
    return lines


def _summary(plan: Plan) -> str:
    counts = plan.counts()
    parts = [
        f"{counts['create']} to create",
        f"{counts['update']} to update",
        f"{counts['delete']} to delete",
    ]
    if counts["retire"]:
        parts.append(f"{counts['retire']} use case(s) to retire")
    if plan.mint_keys:
        parts.append(f"{counts['mint']} key(s) to mint")
    return "Plan: " + ", ".join(parts) + "."


def plan_text(plan: Plan) -> str:
    lines: list[str] = []
    for change in plan.changes:
        lines.extend(_change_lines(change))
    if plan.notes:
        if lines:
            lines.append("")
        lines.append("Left as they are:")
        lines.extend(f"  = {note.path}: {note.message}" for note in plan.notes)
    if lines:
        lines.append("")
    lines.append(
        _summary(plan) if plan.has_changes else "No changes: the database matches the file."
    )
    return "\n".join(lines) + "\n"


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "has_changes": plan.has_changes,
        "prune": plan.prune,
        "mint_keys": plan.mint_keys,
        "summary": plan.counts(),
        "changes": [
            {
                "action": change.action.value,
                "section": change.section.value,
                "path": change.path,
                "key": list(change.key),
                "fields": {
                    item.name: {"before": item.before, "after": item.after}
                    for item in change.fields
                },
                "transitions": list(change.transitions),
            }
            for change in plan.changes
        ],
        "notes": [{"path": note.path, "message": note.message} for note in plan.notes],
    }


def problems_text(problems: tuple[Problem, ...]) -> str:
    return "\n".join(f"  {problem}" for problem in problems) + "\n"
