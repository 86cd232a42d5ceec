"""The portal's playground principal: derived keys per approved use case, one per hour-long
period, carried in the policy snapshot as hashes only, acting as the use case with its own
models and priority, each expiring with its period."""

from __future__ import annotations

import hashlib
import time

import orjson
import pytest

from gateway.policy import parse_snapshot
from governance.choices import Environment, UseCaseStatus
from governance.job_keys import (
    PLAYGROUND_KEY_GRACE_SECONDS,
    PLAYGROUND_KEY_PERIOD_SECONDS,
    job_key,
    playground_key,
    playground_key_hash,
    playground_period,
)
from governance.models import UseCase
from governance.snapshot import snapshot_build
from testkit.factories import make_key, make_model, make_tenant, make_use_case

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_chatbot() -> UseCase:
    tenant = make_tenant("acme", Environment.PROD)
    return make_use_case(tenant, "chatbot", models=(make_model("llama"),), namespace="dev")


def test_an_approved_use_case_has_a_playground_principal_like_its_keys(acme_chatbot) -> None:
    _, plaintext = make_key(acme_chatbot)
    now = playground_period(time.time())
    document = snapshot_build(version=1)
    own = document["keys"][hashlib.sha256(plaintext.encode()).hexdigest()]
    for period in (now, now + 1):
        entry = document["keys"][playground_key_hash(acme_chatbot.pk, period)]
        assert entry["prefix"] == "playground"
        assert entry["key_id"] is None
        assert entry["expires_at"] == (
            (period + 1) * PLAYGROUND_KEY_PERIOD_SECONDS + PLAYGROUND_KEY_GRACE_SECONDS
        )
        for field in ("tenant", "use_case", "use_case_id", "namespace", "models", "priority_class"):
            assert entry[field] == own[field], field  # its limits, models and rank: the key's
        assert playground_key(acme_chatbot.pk, period) not in orjson.dumps(document).decode()
    assert playground_key_hash(acme_chatbot.pk, now - 1) not in document["keys"]
    assert playground_key_hash(acme_chatbot.pk, now + 2) not in document["keys"]
    principal = parse_snapshot(orjson.dumps(document)).principals[
        hashlib.sha256(playground_key(acme_chatbot.pk, now).encode()).hexdigest()
    ]
    assert principal.use_case_id == acme_chatbot.pk
    assert principal.key_prefix == "playground"
    assert not principal.expired(time.time())
    assert principal.expired((now + 1) * PLAYGROUND_KEY_PERIOD_SECONDS + 61)


@pytest.mark.parametrize("status", [UseCaseStatus.SUBMITTED, UseCaseStatus.SUSPENDED])
def test_a_use_case_that_is_not_approved_has_no_playground(acme_chatbot, status) -> None:
    UseCase.objects.filter(pk=acme_chatbot.pk).update(status=status)
    keys = snapshot_build(version=1)["keys"]
    assert not [entry for entry in keys.values() if entry["prefix"] == "playground"]


def test_playground_keys_differ_per_use_case_period_secret_and_from_job_keys() -> None:
    assert playground_key(1, 7).startswith("sk-sy-play-")
    assert playground_key(1, 7) != playground_key(2, 7)
    assert playground_key(1, 7) != playground_key(1, 8)
    assert playground_key(1, 7) != job_key(1, 0)
    assert playground_key(1, 7, secret="a") != playground_key(1, 7, secret="b")
