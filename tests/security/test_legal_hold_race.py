"""A legal hold placed while a retention run is under way stops that run: every deletion
batch re-reads the holds under a lock, so records selected before the hold was placed, but
not yet deleted, survive it (issue 24, defect 9).

The run is paused between its selection and a deletion batch by its ``on_batch`` seam; the
officer places the hold there through the real service. Records come from the real
persisters, objects live on a real S3 server (SeaweedFS).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import valkey

from governance.audit import Actor
from governance.models import Tenant, UseCase
from governance.roles import Role
from governance.services.record_policy import tenant_set_legal_hold, use_case_set_legal_hold
from records.interaction_retention import record_retention_apply
from records.models import InteractionRecord, RecordObject
from testkit.factories import make_tenant, make_use_case, make_user
from testkit.records_store import RecordsStore
from tests.records.test_record_retention import NOW, OLD, at_ms, bucket_keys, persist
from tests.records.test_records import add_record, records_keys  # noqa: F401
from tests.records.test_usage import add_usage

pytestmark = pytest.mark.django_db

HOURS = 3  # three old hours: three objects, one deletion batch each


def hold_use_case(officer: Actor, use_case: UseCase) -> None:
    use_case_set_legal_hold(actor=officer, use_case=use_case, hold=True, reason="Matter 42")


def hold_tenant(officer: Actor, use_case: UseCase) -> None:
    tenant = Tenant.objects.get(pk=use_case.tenant_id)
    tenant_set_legal_hold(actor=officer, tenant=tenant, hold=True, reason="Matter 42")


@pytest.mark.parametrize("place_hold", [hold_use_case, hold_tenant], ids=["use-case", "tenant"])
def test_a_hold_placed_between_batches_keeps_what_the_run_had_not_deleted_yet(
    valkey_client: valkey.Valkey,
    records_store: RecordsStore,
    place_hold: Callable[[Actor, UseCase], None],
) -> None:
    # GIVEN a use case with three old hours of transcripts and an old metadata-only record,
    # all past its 30 days' retention, and olivia, a governance officer
    acme = make_tenant("acme")
    chat = make_use_case(acme, "chat", record_retention_days=30)
    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
    common = {"use_case_id": chat.pk, "tenant": "acme"}
    for hour in range(HOURS):
        add_record(valkey_client, f"full-{hour}", at_ms=at_ms(OLD.replace(hour=hour)), **common)
    add_usage(valkey_client, record_id="meta", record="metadata", at_ms=at_ms(OLD), **common)
    persist(valkey_client)
    assert RecordObject.objects.count() == HOURS
    first_key = RecordObject.objects.order_by("hour").values_list("key", flat=True)[0]

    # WHEN retention runs one object a batch, and olivia places the hold once the first
    # batch is gone and the second is selected
    batches = 0

    def between_batches() -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            place_hold(olivia, chat)

    report = record_retention_apply(now=NOW, objects_per_batch=1, on_batch=between_batches)

    # THEN only the first batch went: every later record and object survives the run
    assert report.objects == 1
    assert set(InteractionRecord.objects.values_list("record_id", flat=True)) == {
        *(f"full-{hour}" for hour in range(1, HOURS)),
        "meta",
    }
    assert RecordObject.objects.count() == HOURS - 1
    stored = bucket_keys(records_store)
    assert first_key not in stored
    assert set(RecordObject.objects.values_list("key", flat=True)) <= stored
    assert chat.pk in report.held
