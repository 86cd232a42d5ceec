"""Two registrations that fit only one at a time, made at once through the service, each
with its own database connection: one is promised, the other refused, and the ledger holds
exactly the promise that was stored.

(On SQLite the database serialises the two writers; the race on the ledger itself, which
PostgreSQL would not serialise, is tested with many clients in
tests/scheduler/files/test_feasibility.py.)"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import valkey
from django.db import connection
from django.utils import timezone

from governance.audit import Actor
from governance.models import FileRegistration
from governance.roles import Role
from scheduler.files import feasibility
from scheduler.files.registration import Infeasible, file_register
from testkit.factories import make_model, make_tenant, make_use_case, make_user


@pytest.mark.django_db(transaction=True)
def test_only_one_of_two_racing_registrations_is_promised(
    live_valkey_settings: Any, valkey_client: valkey.Valkey
) -> None:
    live_valkey_settings.BATCH_DEFAULT_TOKENS_PER_SECOND = 2.0  # 1 token/s for batch
    acme = make_tenant("acme")
    llama = make_model("llama", capabilities=["chat"])
    use_case = make_use_case(acme, "docs", models=(llama,))
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    deadline = timezone.now() + timedelta(hours=1)
    outcomes: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def register(name: str) -> None:
        try:
            barrier.wait()
            file_register(
                actor=Actor.for_user(alice),
                use_case=use_case,
                kind="text",
                filename=name,
                model=llama,
                declared_bytes=8000,  # 2000 tokens each; 3600 fit in the hour
                deadline=deadline,
            )
            outcomes.append("promised")
        except Infeasible:
            outcomes.append("refused")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=register, args=(f"{n}.txt",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(outcomes) == ["promised", "refused"]
    stored = FileRegistration.objects.get()
    promises = valkey_client.hkeys(feasibility.ledger_key("llama"))
    assert promises == [str(stored.pk).encode()]
