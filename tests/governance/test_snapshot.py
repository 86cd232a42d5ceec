"""The policy snapshot carries exactly the keys the gateway should honour."""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, parse_snapshot
from governance.audit import Actor
from governance.choices import ApiKeyStatus, Environment, RecordPolicy, UseCaseStatus
from governance.models import ApiKey, Deployment, Model, UseCase
from governance.services.api_keys import api_key_revoke
from governance.snapshot import snapshot_build, snapshot_publish
from testkit.factories import make_key, make_tenant, make_use_case

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_chatbot() -> UseCase:
    tenant = make_tenant("acme", Environment.PROD)
    model = Model.objects.create(public_id="llama", capabilities=["chat"], timeout_seconds=20)
    Deployment.objects.create(model=model, served_name="llama-8b", replicas=["http://127.0.0.1:1"])
    undeployed = Model.objects.create(public_id="undeployed", capabilities=["chat"])
    return make_use_case(tenant, "chatbot", models=(model, undeployed))


def test_an_active_key_of_an_approved_use_case_resolves_to_its_principal(acme_chatbot) -> None:
    key, plaintext = make_key(acme_chatbot)
    document = snapshot_build(version=7)
    entry = document["keys"][hashlib.sha256(plaintext.encode()).hexdigest()]
    assert entry["tenant"] == "acme"
    assert entry["use_case"] == "chatbot"
    assert entry["environment"] == "prod"
    assert entry["namespace"] == "prod"
    assert entry["models"] == ["llama", "undeployed"]
    assert entry["prefix"] == plaintext[:12] == key.prefix
    # The snapshot holds hashes only: the plaintext appears nowhere in it.
    assert plaintext not in orjson.dumps(document).decode()
    # The default priority matrix ranks prod tenants calling from the prod namespace first.
    assert entry["priority_class"] == "critical"
    assert document["priority_classes"]["critical"]["rank"] == 0
    assert document["use_cases"][str(acme_chatbot.pk)]["slug"] == "chatbot"
    policy = parse_snapshot(orjson.dumps(document))
    assert policy.version == 7
    assert (
        policy.principals[hashlib.sha256(plaintext.encode()).hexdigest()].priority_class
        == "critical"
    )
    assert policy.models["llama"].served_name == "llama-8b"
    assert "undeployed" not in policy.models  # no replica, nothing to offer


@pytest.mark.parametrize(
    "spoil",
    [
        lambda key, uc: ApiKey.objects.filter(pk=key.pk).update(status=ApiKeyStatus.REVOKED),
        lambda key, uc: ApiKey.objects.filter(pk=key.pk).update(status=ApiKeyStatus.PENDING),
        lambda key, uc: ApiKey.objects.filter(pk=key.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        ),
        lambda key, uc: UseCase.objects.filter(pk=uc.pk).update(status=UseCaseStatus.SUSPENDED),
        lambda key, uc: UseCase.objects.filter(pk=uc.pk).update(status=UseCaseStatus.SUBMITTED),
    ],
    ids=["revoked", "pending", "expired", "use-case-suspended", "use-case-not-approved"],
)
def test_keys_that_must_not_work_are_left_out(acme_chatbot, spoil) -> None:
    key, _ = make_key(acme_chatbot)
    spoil(key, acme_chatbot)
    keys = snapshot_build(version=1)["keys"]
    # at most the derived default job key and the playground keys (this period's and the
    # next's) of an approved use case (governance/job_keys.py)
    assert sorted(entry["prefix"] for entry in keys.values()) in (
        [],
        ["job:default", "playground", "playground"],
    )


def test_publishing_bumps_the_version_and_writes_the_document(
    acme_chatbot, live_valkey_settings, valkey_client
) -> None:
    first = snapshot_publish()
    second = snapshot_publish()
    assert second == first + 1
    assert int(valkey_client.get(VERSION_KEY)) == second
    assert parse_snapshot(valkey_client.get(SNAPSHOT_KEY)).version == second


@pytest.mark.django_db(transaction=True)
def test_concurrent_publishers_never_leave_an_older_snapshot_behind(
    acme_chatbot, live_valkey_settings, valkey_client
) -> None:
    from django.db import connection

    versions: list[int] = []

    def publish() -> None:
        try:
            versions.append(snapshot_publish())
        finally:
            connection.close()

    threads = [threading.Thread(target=publish) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(versions) == list(range(1, 9))
    assert (
        parse_snapshot(valkey_client.get(SNAPSHOT_KEY)).version
        == 8
        == int(valkey_client.get(VERSION_KEY))
    )


@pytest.mark.django_db(transaction=True)
def test_issuing_and_revoking_republish_after_commit(
    acme_chatbot, live_valkey_settings, valkey_client
) -> None:
    # Real commits: each service call is its own transaction, as behind a request.
    key, plaintext = make_key(acme_chatbot)
    key_hash = hashlib.sha256(plaintext.encode()).hexdigest()
    assert key_hash in parse_snapshot(valkey_client.get(SNAPSHOT_KEY)).principals
    api_key_revoke(actor=Actor.system("tests"), key=key)
    assert key_hash not in parse_snapshot(valkey_client.get(SNAPSHOT_KEY)).principals


def test_many_writes_in_one_transaction_republish_once(
    acme_chatbot, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        for name in ("a", "b", "c"):
            make_key(acme_chatbot, name)
    assert len(callbacks) == 1
    principals = parse_snapshot(valkey_client.get(SNAPSHOT_KEY)).principals.values()
    assert len([p for p in principals if p.key_id is not None]) == 3


def test_a_publish_while_valkey_is_down_is_deferred_not_lost(
    acme_chatbot, settings, django_capture_on_commit_callbacks, caplog
) -> None:
    from ops.processes import free_port

    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"  # nothing listens
    with django_capture_on_commit_callbacks(execute=True):
        key, _ = make_key(acme_chatbot)
    # The key is committed (the periodic republish will carry it), and the failure is logged.
    assert ApiKey.objects.filter(pk=key.pk, status=ApiKeyStatus.ACTIVE).exists()
    assert "policy_snapshot_publish_deferred" in caplog.text


# --- Keycloak service accounts ----------------------------------------------------------------
def test_a_client_bound_to_an_approved_use_case_acts_as_it_like_a_key(acme_chatbot) -> None:
    """GIVEN acme's approved chatbot bound to client acme-chatbot-worker, and a key of it
    WHEN the snapshot is built
    THEN the client resolves to the same principal as the key, less the key's own fields."""
    UseCase.objects.filter(pk=acme_chatbot.pk).update(
        service_account_client_id="acme-chatbot-worker"
    )
    _, plaintext = make_key(acme_chatbot)
    document = snapshot_build(version=3)

    entry = document["service_accounts"]["acme-chatbot-worker"]
    assert entry == {
        "tenant": "acme",
        "tenant_id": acme_chatbot.tenant_id,
        "environment": "prod",
        "use_case": "chatbot",
        "use_case_id": acme_chatbot.pk,
        "namespace": "prod",
        "models": ["llama", "undeployed"],
        "priority_class": "critical",
    }
    policy = parse_snapshot(orjson.dumps(document))
    service_account = policy.service_accounts["acme-chatbot-worker"]
    key = policy.principals[hashlib.sha256(plaintext.encode()).hexdigest()]
    assert service_account.key_id is None
    assert service_account.key_prefix == "sa:acme-chatbot-worker"
    assert service_account.expires_at is None
    for name in ("tenant", "tenant_id", "environment", "use_case", "use_case_id", "namespace"):
        assert getattr(service_account, name) == getattr(key, name), name
    assert service_account.models == key.models
    assert service_account.priority_class == key.priority_class


@pytest.mark.parametrize(
    "status",
    [UseCaseStatus.DRAFT, UseCaseStatus.SUBMITTED, UseCaseStatus.SUSPENDED, UseCaseStatus.RETIRED],
)
def test_a_client_bound_to_a_use_case_that_is_not_approved_is_left_out(
    acme_chatbot, status
) -> None:
    UseCase.objects.filter(pk=acme_chatbot.pk).update(
        service_account_client_id="acme-chatbot-worker", status=status
    )
    assert snapshot_build(version=1)["service_accounts"] == {}


def test_use_cases_without_a_client_are_not_service_accounts(acme_chatbot) -> None:
    make_use_case(acme_chatbot.tenant, "search", service_account_client_id="acme-search")
    assert set(snapshot_build(version=1)["service_accounts"]) == {"acme-search"}


def test_a_snapshot_from_before_service_accounts_still_parses() -> None:
    old = {"schema": 1, "version": 4, "published_at": 0.0, "models": {}, "keys": {}}
    assert parse_snapshot(orjson.dumps(old)).service_accounts == {}


def test_a_model_deployed_twice_names_each_replica_by_its_deployments_served_name(
    acme_chatbot,
) -> None:
    """Two deployments of one model may serve it under different names: each replica must
    be asked for the name it serves, not the first deployment's."""
    model = Model.objects.get(public_id="llama")
    Deployment.objects.create(
        model=model, served_name="llama-8b-h200", replicas=["http://127.0.0.1:2"]
    )
    policy = parse_snapshot(orjson.dumps(snapshot_build(version=1)))
    llama = policy.models["llama"]
    assert llama.replicas == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert llama.served_name_for("http://127.0.0.1:1") == "llama-8b"
    assert llama.served_name_for("http://127.0.0.1:2") == "llama-8b-h200"


def test_each_use_cases_record_policy_reaches_the_gateway(acme_chatbot) -> None:
    """GIVEN acme's chatbot keeps full records, its search only metadata (the default) and
    its batch none WHEN the snapshot is built THEN the gateway's policy says so per use
    case, and a use case it has never heard of counts as metadata."""
    UseCase.objects.filter(pk=acme_chatbot.pk).update(record_policy=RecordPolicy.FULL)
    search = make_use_case(acme_chatbot.tenant, "search")
    batch = make_use_case(acme_chatbot.tenant, "batch")
    UseCase.objects.filter(pk=batch.pk).update(record_policy=RecordPolicy.NONE)
    document = snapshot_build(version=1)
    assert document["use_cases"][str(acme_chatbot.pk)]["record"] == "full"
    assert document["use_cases"][str(search.pk)]["record"] == "metadata"
    assert document["use_cases"][str(batch.pk)]["record"] == "none"
    policy = parse_snapshot(orjson.dumps(document))
    assert policy.record_policy(acme_chatbot.pk) == "full"
    assert policy.record_policy(search.pk) == "metadata"
    assert policy.record_policy(batch.pk) == "none"
    assert policy.record_policy(10_000_000) == "metadata"


def test_a_snapshot_from_before_record_policies_keeps_metadata() -> None:
    old = {
        "schema": 1,
        "version": 4,
        "published_at": 0.0,
        "models": {},
        "keys": {},
        "use_cases": {
            "3": {
                "tenant": "acme",
                "slug": "chatbot",
                "limits": {
                    "requests_per_minute": None,
                    "tokens_per_minute": None,
                    "tokens_per_day": None,
                },
                "guardrails": [],
            }
        },
    }
    assert parse_snapshot(orjson.dumps(old)).record_policy(3) == "metadata"


def test_a_snapshot_with_an_unknown_record_policy_is_refused() -> None:
    """A typo must not silently turn full records into none (or the reverse)."""
    bad = {
        "schema": 1,
        "version": 4,
        "published_at": 0.0,
        "models": {},
        "keys": {},
        "use_cases": {
            "3": {
                "tenant": "acme",
                "slug": "chatbot",
                "limits": {
                    "requests_per_minute": None,
                    "tokens_per_minute": None,
                    "tokens_per_day": None,
                },
                "guardrails": [],
                "record": "everything",
            }
        },
    }
    with pytest.raises(ValueError, match="record policy 'everything'"):
        parse_snapshot(orjson.dumps(bad))
