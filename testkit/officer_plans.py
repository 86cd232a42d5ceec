"""The portal's officer forms as a test drives them: "Review change" shows the plan
(``portal.officer.plans.Review``), "Apply" applies exactly the plan that was reviewed."""

from __future__ import annotations

from typing import Any

from django.test import Client


def reviewed(client: Client, path: str, data: dict[str, Any]) -> Any:
    """The officer's "Review change": the plan the page shows."""
    response = client.post(path, {**data, "step": "review"})
    assert response.status_code == 200
    return response.context["review"]


def applied(client: Client, path: str, data: dict[str, Any], review: Any) -> int:
    """The officer's "Apply" of the plan ``review`` showed; the answer's status."""
    fingerprint = review.fingerprint
    return client.post(path, {**data, "step": "apply", "fingerprint": fingerprint}).status_code


def changed_fields(review: Any) -> list[tuple[str, str, str]]:
    """(record path, field, value after) of every field the plan changes."""
    return [(row.path, f.name, f.after) for row in review.rows for f in row.fields]


def shown_form(client: Client, path: str) -> dict[str, Any]:
    """The page's form as it is filled in, ready to post back."""
    initial = client.get(path).context["form"].initial
    return {k: v for k, v in initial.items() if v is not None}
