"""An officer's form as a change to the policy, planned and applied by policy as code.

A form edits one record of the policy file as ``manage.py policy export`` would write it; the
edited file is checked by the same parser (``policy_parse``), planned by the same engine
(``plan_build``) and applied by the same applier (``policy_apply``, through the governance
services: validated, audited, republished) as ``manage.py policy plan/apply``. So the review
step shows exactly what "Apply" will do, and a form accepts exactly what a file would.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from governance.audit import Actor
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid, Problem
from governance.policy_as_code.export import policy_data
from governance.policy_as_code.plan import Action, Change, Plan, plan_build
from governance.policy_as_code.render import plan_json
from governance.policy_as_code.schema import PolicyDocument, policy_parse
from governance.policy_as_code.selectors import policy_current

Entry = dict[str, Any]


@dataclass(frozen=True)
class Edit:
    """One record of one section as the form wants it (``entry``), or a whole section."""

    section: str  # "tenants", "use_cases", "priority_classes" or "priority_matrix"
    ident: str  # the record's id in the file ("acme", "acme/chatbot", a class name)
    entry: Any
    key: str = "id"  # the field that names a record of the section
    # Whether records of this one entry that it no longer lists (a guardrail taken off) go.
    prune: bool = False

    @property
    def prefix(self) -> str:
        """Where the edited record's problems point in the file."""
        if self.section == "priority_matrix":
            return "priority_matrix"
        return f"{self.section}[{self.ident}]"


@dataclass(frozen=True)
class FieldRow:
    name: str
    before: str
    after: str


@dataclass(frozen=True)
class ChangeRow:
    action: str
    path: str
    fields: tuple[FieldRow, ...]
    transitions: tuple[str, ...]


@dataclass
class Review:
    """The plan of an edit, or why it cannot be applied."""

    document: PolicyDocument | None = None
    plan: Plan | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.plan is not None and not self.problems

    @property
    def fingerprint(self) -> str:
        return plan_fingerprint(self.plan) if self.plan is not None else ""

    @property
    def rows(self) -> list[ChangeRow]:
        return plan_rows(self.plan) if self.plan is not None else []


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def plan_rows(plan: Plan) -> list[ChangeRow]:
    """The plan as a diff table: per change, each field with its value before and after."""
    rows = []
    for change in plan.changes:
        fields = []
        for item in change.fields:
            if change.action is Action.CREATE and item.after in (None, "", [], {}):
                continue  # a new record's empty defaults say nothing (as ``policy plan``)
            fields.append(FieldRow(item.name, _shown(item.before), _shown(item.after)))
        rows.append(ChangeRow(change.action.value, change.path, tuple(fields), change.transitions))
    return rows


def plan_fingerprint(plan: Plan) -> str:
    """What the officer reviewed: "Apply" refuses a plan that has changed since."""
    text = json.dumps(plan_json(plan), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def current_record(section: str, ident: str, key: str = "id") -> Entry | None:
    """One record as ``manage.py policy export`` writes it today; None if there is none."""
    for record in policy_data(policy_current()).get(section, []):
        if str(record.get(key)) == ident:
            return dict(record)
    return None


def _edited_data(edit: Edit) -> dict[str, Any]:
    """The policy file with only the edited section, every other record of it as it is."""
    data = policy_data(policy_current())
    if edit.section == "priority_matrix":
        return {"version": data["version"], "priority_matrix": edit.entry}
    records: list[Entry] = [
        r for r in data.get(edit.section, []) if str(r.get(edit.key)) != edit.ident
    ]
    records.append(edit.entry)
    return {"version": data["version"], edit.section: records}


class _DryRun(Exception):
    """Raised inside a transaction to roll back an apply that was only a rehearsal."""


def review_build(edit: Edit, actor: Actor) -> Review:
    """Parse and plan the edit, then rehearse its apply (rolled back) so that every refusal
    of the services shows on the form, before anything is saved."""
    try:
        document = policy_parse(_edited_data(edit))
        plan = plan_build(document, policy_current(), prune=edit.prune)
    except PolicyInvalid as exc:
        return Review(problems=list(exc.problems))
    try:
        with transaction.atomic():
            policy_apply(document=document, actor=actor, prune=edit.prune)
            raise _DryRun
    except _DryRun:
        pass
    except PolicyInvalid as exc:
        return Review(document=document, plan=plan, problems=list(exc.problems))
    return Review(document=document, plan=plan)


class PlanChanged(Exception):
    """The database moved since the officer reviewed the plan: review it again."""


def review_apply(edit: Edit, actor: Actor, *, reviewed: str) -> Plan:
    """Apply the edit if its plan is still the one reviewed (fingerprint ``reviewed``)."""
    with transaction.atomic():
        review = review_build(edit, actor)
        if not review.ok:
            assert review.problems
            raise PolicyInvalid(review.problems)
        assert review.document is not None
        assert review.plan is not None
        if review.fingerprint != reviewed:
            raise PlanChanged
        return policy_apply(document=review.document, actor=actor, prune=edit.prune).plan


def problems_by_field(
    problems: list[Problem], prefix: str, field_of: Callable[[str], str | None]
) -> tuple[dict[str, list[str]], list[str]]:
    """Problems of the edited record by form field, and the rest as whole-form messages.

    A parser's problem names the place in the file (``use_cases[acme/bot].limits.tokens_per_day``);
    a service's refusal names the model field at the start of its message ("max_concurrent: …").
    """
    by_field: dict[str, list[str]] = {}
    rest: list[str] = []
    for problem in problems:
        name: str | None = None
        message = problem.message
        if problem.path.startswith(prefix):
            place = problem.path.removeprefix(prefix).lstrip(".")
            if place:
                name = field_of(place)
            else:
                head, sep, tail = message.partition(": ")
                if sep and (named := field_of(head)) is not None:
                    name, message = named, tail
        if name is None:
            rest.append(str(problem))
        else:
            by_field.setdefault(name, []).append(message)
    return by_field, rest


def changes_of(plan: Plan, action: Action) -> list[Change]:
    return [c for c in plan.changes if c.action is action]


def lookup(mapping: Mapping[str, str]) -> Callable[[str], str | None]:
    """A ``field_of`` for ``problems_by_field``: a place (or its first part) → a form field."""

    def field_of(place: str) -> str | None:
        if place in mapping:
            return mapping[place]
        head = place.split("[", 1)[0].split(".", 1)[0]
        return mapping.get(head)

    return field_of
