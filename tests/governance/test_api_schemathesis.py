"""Schemathesis over /api/: every operation of the served OpenAPI schema, with generated input,
signed in as each role in turn (developer, auditor, officer, admin).

What must hold for every generated case and every role: no 5xx, and the response is what the
schema says (a documented status code, content type, headers and body). The Django app is
called in-process over WSGI, inside the test's database transaction; signing in is a real
session cookie with its CSRF pair, as the portal's JavaScript sends them.

Deterministic for CI: a fixed seed, derandomized, no example database, no deadlines.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from hypothesis import strategies as st
from schemathesis import checks

from governance.models import (
    GuardrailSelection,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    SlaClass,
)
from governance.roles import Role
from records.models import GuardrailFinding
from testkit.dead_letters import dead_letter
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db

# Cases per operation; each case is sent once per role. Keeps the whole run to a few minutes.
MAX_EXAMPLES = 12
# Less privileged first, so that what an officer deletes was first tried by the others.
ROLES = (
    ("alice", Role.DEVELOPER),
    ("audrey", Role.AUDITOR),
    ("olivia", Role.OFFICER),
    ("root", Role.ADMIN),
)
CSRF = "schemathesisschemathesisschemat0"  # a 32-character CSRF secret, sent as cookie and header

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 26,
        # Signed in by session cookie: no generated Authorization headers or cookies.
        "generation": {
            "mode": "positive",
            "database": "none",
            "with-security-parameters": False,
        },
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    }
)

# The app is loaded from its own /api/schema/ endpoint, so the test runs against what is served.
schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler(), config=CONFIG)

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]

# Keys of records that exist, by collection, for path parameters: filled by the ``world``
# fixture, read when a case is drawn, so that half the cases address real records.
KNOWN: dict[str, list[Any]] = {}


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path_parameters: dict[str, Any]
) -> st.SearchStrategy[dict[str, Any]]:
    assert context.operation is not None
    collection = context.operation.path.split("/")[2]
    known = KNOWN.get(collection, [])
    if not path_parameters or len(path_parameters) != 1 or not known:
        return st.just(path_parameters)
    (name,) = path_parameters
    real = st.sampled_from(known).map(lambda value: {name: value})
    return st.one_of(st.just(path_parameters), real)


# Body fields that name other records, by the record they name (keys of KNOWN).
REFERENCES = {
    "tenant": "tenants",
    "model": "models",
    "allowed_models": "models",
    "priority_class": "priority-classes",
    "use_case": "use-cases",
    "members": "usernames",
}


@schema.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    """Half the time, a field that names another record names one that exists (and null
    stays null).

    The schema cannot list which records exist; without this nearly every create would be a
    400 for a dangling reference and the handlers behind it would never run.
    """
    if not isinstance(body, dict):
        return st.just(body)
    choices: dict[str, st.SearchStrategy[Any]] = {}
    for field, value in body.items():
        known = KNOWN.get(REFERENCES.get(field, ""), [])
        if not known or value is None:  # null where the schema wants no reference
            continue
        real = st.sampled_from(known)
        if isinstance(value, list):
            real = st.lists(real, max_size=len(known), unique=True)
        choices[field] = st.one_of(st.just(value), real)
    return st.fixed_dictionaries(choices).map(lambda replaced: {**body, **replaced})


@pytest.fixture
def wsgi_in_transaction() -> Iterator[None]:
    """Keep the test's connection across in-process requests, as Django's test client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def sessions(
    wsgi_in_transaction: None,
    company_guardrails: Any,
    live_valkey_settings: Any,
    valkey_client: Any,
) -> Iterator[list[tuple[str, dict[str, str]]]]:
    """Two tenants with use cases, keys, guardrails (a company's own, so that their settings
    are validated for real), findings, limits and dead-lettered async tasks (on the test's
    Valkey); a signed-in session per role."""
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    draft = make_use_case(globex, "drafting", status="draft")
    key, _ = make_key(chatbot)
    guardrail = GuardrailSelection.objects.create(
        use_case=chatbot,
        guardrail="wordlist",
        side="request",
        action="redact",
        config={"words": ["falcon"], "case_sensitive": False},
    )
    finding = GuardrailFinding.objects.create(
        stream_id="1-0",
        request_id="req-1",
        occurred_at=datetime(2025, 3, 4, 14, 2, tzinfo=UTC),
        tenant="acme",
        tenant_id=acme.pk,
        use_case_id=chatbot.pk,
        model="llama",
        stage="request",
        guardrail="wordlist",
        action="redacted",
        entities={"word": 1},
        score=1.0,
    )
    limit = RateLimitPolicy.objects.create(
        name="acme-cap", scope="tenant", tenant=acme, requests_per_minute=600
    )
    record = make_record(chatbot, key_id=key.pk)
    sla = SlaClass.objects.create(
        use_case=chatbot,
        name="overnight",
        windows=[{"days": ["mon"], "start": "20:00", "end": "06:00"}],
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["pdf"],
    )
    KNOWN.update(
        {
            "tenants": ["acme", "globex"],
            "models": ["llama"],
            "deployments": list(llama.deployments.values_list("pk", flat=True)),
            "use-cases": [chatbot.pk, draft.pk],
            "api-keys": [key.pk],
            "guardrail-selections": [guardrail.pk],
            "guardrail-findings": [finding.pk],
            "records": [record.record_id],
            "priority-classes": list(PriorityClass.objects.values_list("name", flat=True)),
            "priority-rules": list(PriorityRule.objects.values_list("pk", flat=True)[:3]),
            "rate-limit-policies": [limit.pk],
            "sla-classes": [sla.pk],
            "usernames": [username for username, _role in ROLES],
            # Replayed or discarded by the first officer's case, a 404 for the rest.
            "async": [dead_letter(valkey_client, chatbot)[0] for _ in range(3)],
        }
    )
    result = []
    for username, role in ROLES:
        client = Client()
        user: Any = make_user(username, role, tenants=(acme,))
        client.force_login(user)
        cookies = {"sessionid": client.cookies["sessionid"].value, "csrftoken": CSRF}
        result.append((username, cookies))
    try:
        yield result
    finally:
        KNOWN.clear()


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_api_conforms_to_its_schema(
    case: schemathesis.Case, sessions: list[tuple[str, dict[str, str]]]
) -> None:
    for _username, cookies in sessions:
        case.call_and_validate(cookies=cookies, headers={"X-CSRFToken": CSRF}, checks=CHECKS)
