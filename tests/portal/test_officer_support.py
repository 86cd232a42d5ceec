"""Helpers for the officer's form tests (no tests here): review a form, then apply it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import unescape
from typing import Any, cast

from django.test import Client
from django.urls import reverse

from testkit.factories import make_user

_FINGERPRINT = re.compile(r'name="fingerprint" value="([0-9a-f]{64})"')
_ROW = re.compile(r'<tr class="plan-(\w+)"[^>]*>(.*?)</tr>', re.S)
_CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)
_TAGS = re.compile(r"<[^>]+>")


def client_for(username: str, *roles: Any, tenants: tuple[Any, ...] = ()) -> Client:
    client = Client()
    client.force_login(cast(Any, make_user(username, *roles, tenants=tenants)))
    return client


def text(html: str) -> str:
    return " ".join(unescape(_TAGS.sub(" ", html)).split())


@dataclass(frozen=True)
class PlanCell:
    action: str
    path: str
    field: str
    before: str
    after: str


def plan_cells(html: str) -> list[PlanCell]:
    """The review page's diff table, one entry per field (the record carried down rowspans)."""
    cells: list[PlanCell] = []
    action = path = ""
    for row_action, row in _ROW.findall(html):
        tds = [text(td) for td in _CELL.findall(row)]
        if len(tds) == 5:
            action, path = tds[0], tds[1].split(" lifecycle:")[0]
            tds = tds[2:]
        elif len(tds) == 3 and row_action != action:
            raise AssertionError(f"a row of {row_action} without its record: {tds}")
        if len(tds) == 3:
            cells.append(PlanCell(action, path, *tds))
    return cells


def fingerprint(html: str) -> str:
    found = _FINGERPRINT.search(html)
    assert found, "the review page carries no plan fingerprint"
    return found.group(1)


def review(client: Client, url: str, data: dict[str, Any]) -> str:
    response = client.post(url, {**data, "step": "review"})
    assert response.status_code == 200
    return response.content.decode()


def apply(client: Client, url: str, data: dict[str, Any], reviewed_html: str) -> Any:
    return client.post(url, {**data, "step": "apply", "fingerprint": fingerprint(reviewed_html)})


def guardrail_rows(*rows: dict[str, str], extra: int = 1) -> dict[str, str]:
    """A guardrail formset's POST data: these rows, then ``extra`` empty ones."""
    data = {
        "guardrails-TOTAL_FORMS": str(len(rows) + extra),
        "guardrails-INITIAL_FORMS": "0",
        "guardrails-MIN_NUM_FORMS": "0",
        "guardrails-MAX_NUM_FORMS": "20",
    }
    for index, row in enumerate([*rows, *([{}] * extra)]):
        data[f"guardrails-{index}-guardrail"] = row.get("guardrail", "")
        data[f"guardrails-{index}-side"] = row.get("side", "request")
        data[f"guardrails-{index}-action"] = row.get("action", "block")
        data[f"guardrails-{index}-config"] = row.get("config", "")
    return data


def url(name: str, *args: Any) -> str:
    return reverse(f"portal:{name}", args=args)
