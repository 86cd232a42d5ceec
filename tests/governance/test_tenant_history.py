"""History belongs to a tenant, not to its slug: after a rename, and a new tenant taking the
old slug, audit events and admission decisions stay with the tenant that made them."""

from __future__ import annotations

import importlib
import time

import pytest
import valkey
from django.db import DatabaseError, transaction
from django.utils import timezone

from gateway.accounting import DECISION_FIELDS, DECISIONS_STREAM
from governance.audit import GENESIS_HASH, Actor, audit_verify, event_hash
from governance.models import AuditChainHead, AuditEvent, Tenant
from governance.roles import Role
from governance.selectors import audit_events_visible
from governance.services.generic_records import record_create, record_update
from records.models import AdmissionDecision
from records.selectors import admission_decisions_visible
from records.usage import REFUSAL_ACTION, usage_persist
from testkit.factories import make_use_case, make_user

pytestmark = pytest.mark.django_db

SYSTEM = Actor.system("tests")


def refusal_as_the_gateway_saw_it(client: valkey.Valkey, *, tenant: str, use_case_id: int) -> None:
    fields: dict[str, object] = dict.fromkeys(DECISION_FIELDS, "")
    fields.update(
        request_id="r-1",
        at_ms=int(time.time() * 1000),
        decision="rejected",
        reason="acme-requests-per-minute",
        tenant=tenant,
        use_case_id=use_case_id,
        key_id=11,
        model="llama-test",
        wait_ms=0,
        policy_version=3,
    )
    client.xadd(DECISIONS_STREAM, {k: str(v) for k, v in fields.items()})


def test_a_renamed_tenant_keeps_its_history_when_its_old_slug_is_reused(
    valkey_client: valkey.Valkey,
) -> None:
    original = record_create(actor=SYSTEM, instance=Tenant(**_fields("acme")))
    use_case = make_use_case(original)
    # The gateway refuses a request while the tenant is still called "acme"...
    refusal_as_the_gateway_saw_it(valkey_client, tenant="acme", use_case_id=use_case.pk)
    # ...then the tenant is renamed and another tenant takes the old slug...
    record_update(actor=SYSTEM, instance=original, changes={"slug": "acme-legacy"})
    newcomer = record_create(actor=SYSTEM, instance=Tenant(**_fields("acme")))
    # ...before the persister stores the refusal.
    usage_persist(client=valkey_client)

    original_dev = make_user("dora", Role.DEVELOPER, tenants=(original,))
    newcomer_dev = make_user("nick", Role.DEVELOPER, tenants=(newcomer,))

    decision = AdmissionDecision.objects.get()
    assert decision.tenant_id == original.pk
    assert decision.tenant == "acme"  # the slug as the gateway saw it, for display
    assert list(admission_decisions_visible(original_dev)) == [decision]
    assert list(admission_decisions_visible(newcomer_dev)) == []

    created = AuditEvent.objects.get(action="tenant.create", object_id=str(original.pk))
    assert created.tenant_id == original.pk
    assert created.tenant_slug == "acme"
    mine = set(audit_events_visible(original_dev).values_list("action", flat=True))
    assert mine == {"tenant.create", "tenant.update", REFUSAL_ACTION}
    theirs = audit_events_visible(newcomer_dev)
    assert {e.object_id for e in theirs} == {str(newcomer.pk)}
    assert all(e.tenant_id == newcomer.pk for e in theirs)
    refusal_events = AuditEvent.objects.filter(object_type="governance.usecase")
    assert refusal_events.exists()
    assert all(e.tenant_id == original.pk for e in refusal_events)
    assert audit_verify().ok


def test_tenant_id_is_covered_by_the_event_hash() -> None:
    tenant = record_create(actor=SYSTEM, instance=Tenant(**_fields("globex")))
    event = AuditEvent.objects.get(action="tenant.create", object_id=str(tenant.pk))
    forged = AuditEvent(**{f.attname: getattr(event, f.attname) for f in AuditEvent._meta.fields})
    forged.tenant_id = tenant.pk + 1000
    assert event_hash(forged) != event.hash


def _fields(slug: str) -> dict[str, object]:
    return {
        "slug": slug,
        "name": slug.title(),
        "environment": "prod",
        "business_unit": f"{slug.title()} BU",
        "application_id": "APP-1000",
        "owner_email": f"owner@{slug}.example",
    }


def _legacy_event(sequence: int, prev: str, obj_type: str, obj_id: int, slug: str) -> AuditEvent:
    """An event as written before tenant ids: hash without them, tenant_id unset."""
    event = AuditEvent(
        sequence=sequence,
        occurred_at=timezone.now(),
        actor="system:tests",
        action="x.update",
        object_type=obj_type,
        object_id=str(obj_id),
        tenant_slug=slug,
        prev_hash=prev,
    )
    event.hash = event_hash(event)
    event.save()
    return event


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_existing_history_from_slug_to_id() -> None:
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    audit_migration = importlib.import_module("governance.migrations.0006_tenant_id")
    decision_migration = importlib.import_module("scheduler.migrations.0003_tenant_id")

    original = Tenant.objects.create(**_fields("acme"))
    use_case = make_use_case(original)
    first = _legacy_event(1, GENESIS_HASH, "governance.tenant", original.pk, "acme")
    second = _legacy_event(2, first.hash, "governance.usecase", use_case.pk, "acme")
    AuditChainHead.objects.create(id=1, last_sequence=2, last_hash=second.hash)
    AdmissionDecision.objects.create(
        stream_id="1-0",
        request_id="r",
        occurred_at=timezone.now(),
        decision="rejected",
        tenant="acme",
        use_case_id=use_case.pk,
        model="m",
    )
    # Renamed, and the old slug reused, before the migration ran.
    Tenant.objects.filter(pk=original.pk).update(slug="acme-legacy")
    Tenant.objects.create(**_fields("acme"))

    apps = MigrationLoader(connection).project_state(("scheduler", "0003_tenant_id")).apps
    with connection.schema_editor() as editor:
        audit_migration.backfill(apps, editor)
        decision_migration.backfill(apps, editor)

    assert list(AuditEvent.objects.order_by("sequence").values_list("tenant_id", flat=True)) == [
        original.pk,
        original.pk,
    ]
    assert AdmissionDecision.objects.get().tenant_id == original.pk
    assert audit_verify().ok  # the legacy hashes never covered the id
    # The append-only trigger is back.
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE governance_auditevent SET actor = 'mallory' WHERE sequence = 1")
