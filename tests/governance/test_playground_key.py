"""The portal's playground principal: one derived key per approved use case, carried in the
policy snapshot as its hash only, acting as the use case with its own models and priority."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from gateway.policy import parse_snapshot
from governance.choices import Environment, UseCaseStatus
from governance.job_keys import job_key, playground_key, playground_key_hash
from governance.models import UseCase
from governance.snapshot import snapshot_build
from tests.factories import make_key, make_model, make_tenant, make_use_case

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_chatbot() -> UseCase:
    tenant = make_tenant("acme", Environment.PROD)
    return make_use_case(tenant, "chatbot", models=(make_model("llama"),), namespace="dev")


def test_an_approved_use_case_has_a_playground_principal_like_its_keys(acme_chatbot) -> None:
    _, plaintext = make_key(acme_chatbot)
    document = snapshot_build(version=1)
    own = document["keys"][hashlib.sha256(plaintext.encode()).hexdigest()]
    entry = document["keys"][playground_key_hash(acme_chatbot.pk)]
    assert entry["prefix"] == "playground"
    assert entry["key_id"] is None
    assert entry["expires_at"] is None
    for field in ("tenant", "use_case", "use_case_id", "namespace", "models", "priority_class"):
        assert entry[field] == own[field], field  # its limits, models and rank are the key's
    assert playground_key(acme_chatbot.pk) not in orjson.dumps(document).decode()
    principal = parse_snapshot(orjson.dumps(document)).principals[
        hashlib.sha256(playground_key(acme_chatbot.pk).encode()).hexdigest()
    ]
    assert principal.use_case_id == acme_chatbot.pk
    assert principal.key_prefix == "playground"


@pytest.mark.parametrize("status", [UseCaseStatus.SUBMITTED, UseCaseStatus.SUSPENDED])
def test_a_use_case_that_is_not_approved_has_no_playground(acme_chatbot, status) -> None:
    UseCase.objects.filter(pk=acme_chatbot.pk).update(status=status)
    assert playground_key_hash(acme_chatbot.pk) not in snapshot_build(version=1)["keys"]


def test_playground_keys_differ_per_use_case_from_job_keys_and_with_the_secret() -> None:
    assert playground_key(1).startswith("sk-sy-play-")
    assert playground_key(1) != playground_key(2)
    assert playground_key(1) != job_key(1, 0)
    assert playground_key(1, secret="a") != playground_key(1, secret="b")
