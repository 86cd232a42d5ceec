"""The dispatcher with a frozen clock: windows, not_before, earliest deadline first, the bound.

Real Valkey holds the leases; the clock is the ``now`` the dispatcher is given (beat passes
the real one), so each case is decided at an exact instant.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import valkey

from governance.choices import FileState
from governance.models import FileRegistration
from scheduler.files.dispatch import dispatch_order, file_jobs_dispatch
from scheduler.files.leases import lease_drop, lease_key, lease_renew, lease_take
from testkit.factories import make_model, make_tenant, make_use_case
from testkit.file_jobs_world import seed_priority, sla_class

pytestmark = pytest.mark.django_db

# Tuesday 24 November 2026, in UTC (the classes' zone is UTC too)
NOON = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
NIGHT = datetime(2026, 11, 24, 21, 0, tzinfo=UTC)


@pytest.fixture
def world(settings: Any, valkey_url: str, valkey_client: valkey.Valkey) -> dict[str, Any]:
    settings.VALKEY_URL = valkey_url
    settings.FILE_JOB_LEASE_SECONDS = 30.0
    classes = seed_priority()
    llama = make_model("llama", capabilities=["chat"])
    use_case = make_use_case(make_tenant("acme"), "docs", models=(llama,))
    nightly = sla_class(
        use_case,
        "nightly",
        classes["batch"],
        turnaround_seconds=None,
        windows=[{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "20:00", "end": "06:00"}],
        time_zone="UTC",
    )
    anytime = sla_class(use_case, "anytime", classes["batch"])

    def queued(name: str, sla: Any, due: datetime, **fields: Any) -> FileRegistration:
        return FileRegistration.objects.create(
            use_case=use_case,
            registered_by="tests",
            kind="text",
            filename=name,
            model=llama,
            declared_bytes=10,
            sla_class=sla,
            state=FileState.QUEUED,
            estimated_tokens=10,
            promised_by=due,
            **fields,
        )

    return {"nightly": nightly, "anytime": anytime, "queued": queued}


def _collect(sent: list[int]) -> Any:
    return lambda pk, token: sent.append(pk)


def test_a_job_outside_its_window_waits_and_runs_once_it_opens(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    night_job = world["queued"]("n.txt", world["nightly"], NOON + timedelta(days=1))
    sent: list[int] = []
    assert file_jobs_dispatch(now=NOON, client=valkey_client, send=_collect(sent)) == []
    assert not valkey_client.exists(lease_key(night_job.pk))

    assert file_jobs_dispatch(now=NIGHT, client=valkey_client, send=_collect(sent)) == [
        night_job.pk
    ]
    assert sent == [night_job.pk]
    assert valkey_client.exists(lease_key(night_job.pk))


def test_the_window_closes_at_its_end_and_saturday_is_not_a_weekday(
    world: dict[str, Any],
) -> None:
    job = world["queued"]("n.txt", world["nightly"], NOON + timedelta(days=7))
    wednesday_morning = datetime(2026, 11, 25, 5, 59, tzinfo=UTC)
    assert dispatch_order(wednesday_morning) == [job]  # Tuesday's window, still open
    assert dispatch_order(wednesday_morning + timedelta(minutes=1)) == []
    assert dispatch_order(datetime(2026, 11, 28, 21, 0, tzinfo=UTC)) == []  # a Saturday
    assert dispatch_order(datetime(2026, 11, 27, 23, 0, tzinfo=UTC)) == [job]  # Friday night


def test_not_before_holds_a_job_back(world: dict[str, Any]) -> None:
    job = world["queued"](
        "a.txt", world["anytime"], NOON + timedelta(hours=5), not_before=NOON + timedelta(hours=1)
    )
    assert dispatch_order(NOON) == []
    assert dispatch_order(NOON + timedelta(hours=1)) == [job]


def test_earliest_deadline_first_up_to_the_concurrency_bound(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN three runnable jobs due at 23:00, 22:00 and 22:30 and room for two WHEN the
    dispatcher runs THEN it hands out 22:00 then 22:30; the next run hands out nothing
    while both hold their leases, and the third once one of them ends."""
    queued = world["queued"]
    late = queued("late.txt", world["anytime"], NIGHT + timedelta(hours=2))
    first = queued("first.txt", world["anytime"], NIGHT + timedelta(hours=1))
    second = queued("second.txt", world["nightly"], NIGHT + timedelta(hours=1, minutes=30))
    sent: list[int] = []

    assert file_jobs_dispatch(
        now=NIGHT, client=valkey_client, concurrency=2, send=_collect(sent)
    ) == [first.pk, second.pk]
    assert (
        file_jobs_dispatch(now=NIGHT, client=valkey_client, concurrency=2, send=_collect(sent))
        == []
    )

    FileRegistration.objects.filter(pk=first.pk).update(state=FileState.DONE)
    token = valkey_client.get(lease_key(first.pk))
    assert token is not None
    assert lease_drop(valkey_client, first.pk, token.decode())
    assert file_jobs_dispatch(
        now=NIGHT, client=valkey_client, concurrency=2, send=_collect(sent)
    ) == [late.pk]
    assert sent == [first.pk, second.pk, late.pk]


def test_a_running_job_whose_lease_lapsed_is_handed_out_again(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """A worker that died stops renewing: its job (still ``running``) goes out again."""
    job = world["queued"]("r.txt", world["anytime"], NIGHT + timedelta(hours=1))
    FileRegistration.objects.filter(pk=job.pk).update(state=FileState.RUNNING)
    dead = lease_take(valkey_client, job.pk, 30)
    assert dead is not None
    sent: list[int] = []
    assert file_jobs_dispatch(now=NIGHT, client=valkey_client, send=_collect(sent)) == []

    valkey_client.delete(lease_key(job.pk))  # what the lease's expiry does
    assert file_jobs_dispatch(now=NIGHT, client=valkey_client, send=_collect(sent)) == [job.pk]
    assert not lease_renew(valkey_client, job.pk, dead, 30)  # the dead worker's is gone
