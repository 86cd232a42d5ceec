"""The feasibility model keeps its promises against a real fleet: every accepted file is done
by its ``promised_by``, with the rate measured from vLLM's counters, not assumed.

A real gateway and fleet watcher in front of a chat simulator (simulated time ×2: one
document pass takes about two seconds) and an embedding simulator, real Valkey, the files
bucket on SeaweedFS. The documents are small enough (one part, read whole by one LLM pass)
that their estimate is their real cost, less the answer's tokens: the promises are tight,
and a model that overpromised (a rate it does not get, a start it cannot make) misses them.

Interactive traffic first saturates the chat model, so the watcher's
``capacity`` is a measurement; then a burst of documents asks for a short turnaround, more than
the batch share can do in it: the model accepts some and refuses the rest. The beat's two tasks
run here every half second and hand jobs to a thread pool running ``file_job_run`` (what a
Celery worker runs; tests/scheduler/files/test_file_jobs_worker.py runs it in one). The benchmark
at scale is bench/files/deadlines.py.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import valkey
from django.db import connection

from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration
from governance.snapshot import snapshot_publish
from scheduler.files import feasibility
from scheduler.files.dispatch import file_jobs_dispatch
from scheduler.files.jobs import file_job_run
from scheduler.files.pipelines.documents import (
    DEFAULT_PROMPT,
    SUMMARY_INPUT_CHARS,
    SUMMARY_MAX_TOKENS,
)
from scheduler.files.registration import Infeasible
from scheduler.files.uploads import uploads_consume
from simulator.tokens import VOCABULARY
from testkit.factories import make_key, make_model, make_tenant, make_use_case
from testkit.file_jobs_world import register, seed_priority, sla_class, upload
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.scheduler.files.conftest import FilesBucket

pytestmark = pytest.mark.django_db(transaction=True)  # jobs run on other threads' connections

SHARE = 0.5
TURNAROUND = 15  # seconds
DOCUMENTS = 20
DOCUMENT_BYTES = 12_000  # 3,000 estimated tokens; one part, read whole by one LLM pass
CHAT_TIMING = [
    "--max-num-seqs", "8", "--time-scale", "2", "--decode-step-ms", "8",
    "--prefill-tokens-per-s", "20000", "--scheduling-policy", "priority",
]  # fmt: skip


def _text(rng: random.Random, size: int) -> bytes:
    words = " ".join(rng.choice(VOCABULARY) for _ in range(size // 4))
    lines = [words[i : i + 79] for i in range(0, len(words), 79)]
    return "\n".join(lines).encode()[:size]


@pytest.fixture
def world(
    settings: Any,
    valkey_url: str,
    files_bucket: FilesBucket,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> dict[str, Any]:
    settings.VALKEY_URL = valkey_url
    settings.BATCH_CAPACITY_SHARE = SHARE
    settings.FILE_JOB_RETRY_MAX_SECONDS = 1.0
    settings.FILE_JOBS_CONCURRENCY = 4
    # The start lag stays the product's default (4 s): the beat below takes 0.5 s to consume,
    # 0.5 to dispatch, plus its own database work, and on PostgreSQL under a full CI run 2 s
    # left one job 0.22 s late — the margin a busy production beat needs as well.
    classes = seed_priority(batch_queue_timeout=600.0)
    classes["batch"].max_pool_share = SHARE  # the gateway holds file work to the planned share
    classes["batch"].save(update_fields=["max_pool_share"])
    chat = start_simulator("llama", *CHAT_TIMING)
    embed = start_simulator("embed", "--kind", "embedding", "--time-scale", "0")
    llama = make_model("llama", [chat.base_url], capabilities=["chat"])
    llama.deployments.update(max_in_flight_per_replica=8)
    embedder = make_model("embed", [embed.base_url], capabilities=["embeddings"])
    use_case = make_use_case(make_tenant("acme"), "claims", models=(llama, embedder))
    quick = sla_class(use_case, "quick", classes["batch"], turnaround_seconds=TURNAROUND)
    _, interactive = make_key(use_case)
    snapshot_publish()
    gateway = start_gateway()
    settings.FILE_JOBS_GATEWAY_URL = gateway.base_url
    return {
        "use_case": use_case,
        "llama": llama,
        "quick": quick,
        "gateway": gateway.base_url,
        "interactive": interactive,
    }


def _saturate(gateway: str, key: str, client: valkey.Valkey) -> float:
    """Interactive document-sized turns, 16 at a time, until the watcher has measured a
    capacity (its interval is 5 s); the batch rate the model will promise from."""
    rng = random.Random(3)
    text = _text(rng, SUMMARY_INPUT_CHARS).decode()
    measured = threading.Event()

    def turn(n: int) -> None:
        with httpx.Client(timeout=60) as http:
            while not measured.is_set():
                http.post(  # an answer or a refusal: only the load matters here
                    f"{gateway}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={
                        "model": "llama",
                        "messages": [
                            {"role": "system", "content": DEFAULT_PROMPT},
                            {"role": "user", "content": f"[{n}] {text}"},
                        ],
                        "max_tokens": SUMMARY_MAX_TOKENS,
                    },
                )
                n += 100

    threads = [threading.Thread(target=turn, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    try:
        key_name = feasibility.throughput_key("llama")
        deadline = time.monotonic() + 30
        # two intervals: the first may have begun before the load did
        while time.monotonic() < deadline:
            capacity = cast(bytes | None, client.hget(key_name, "capacity"))
            if capacity is not None and float(capacity) > 0:
                break
            time.sleep(0.2)
        time.sleep(5.5)
    finally:
        measured.set()
        for thread in threads:
            thread.join()
    from scheduler.files.registration import capacity_settings

    rate, is_measured = feasibility.batch_rate(
        client, "llama", capacity_settings(), now=time.time()
    )
    assert is_measured
    return rate


@pytest.fixture
def beat(valkey_client: valkey.Valkey) -> Iterator[None]:
    """The beat's two tasks every half second; jobs run on a pool, as on a worker."""
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="file-job")

    def run(pk: int, token: str) -> None:
        try:
            file_job_run(pk, token, client=valkey_client)
        finally:
            connection.close()

    def send(pk: int, token: str) -> None:
        pool.submit(run, pk, token)

    def loop() -> None:
        try:
            while not stop.is_set():
                uploads_consume(client=valkey_client)
                file_jobs_dispatch(client=valkey_client, send=send)
                stop.wait(0.5)
        finally:
            connection.close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        pool.shutdown(wait=True)


def test_every_accepted_document_is_done_by_its_promise(
    world: dict[str, Any], valkey_client: valkey.Valkey, beat: None
) -> None:
    """GIVEN the chat model's capacity measured under load WHEN ten large documents ask at
    once for a turnaround the batch share cannot give them all THEN some are refused, and
    every accepted one, uploaded at once, is done by its promised_by."""
    rate = _saturate(world["gateway"], world["interactive"], valkey_client)
    assert rate * TURNAROUND < DOCUMENTS * DOCUMENT_BYTES / 4  # the burst is more than fits
    rng = random.Random(11)
    accepted: list[FileRegistration] = []
    refused = 0
    for n in range(DOCUMENTS):
        content = _text(rng, DOCUMENT_BYTES)
        try:
            registration = register(
                world["use_case"], world["llama"], "text", f"claim-{n}.txt", content,
                sla_class=world["quick"],
            )  # fmt: skip
        except Infeasible:
            refused += 1
            continue
        upload(valkey_client, registration, content)
        accepted.append(registration)
    assert refused >= 1
    assert len(accepted) >= 2

    pks = [registration.pk for registration in accepted]
    final = [FileState.DONE, FileState.FAILED, FileState.CANCELLED]
    wait_until = time.monotonic() + TURNAROUND + 30
    while time.monotonic() < wait_until:
        if not FileRegistration.objects.filter(pk__in=pks).exclude(state__in=final).exists():
            break
        time.sleep(0.5)

    late = []
    for registration in FileRegistration.objects.filter(pk__in=pks).order_by("pk"):
        done = AuditEvent.objects.filter(
            object_id=str(registration.pk), action="fileregistration.done"
        ).first()
        if done is None or done.occurred_at > registration.promised_by:
            late.append(
                (
                    registration.pk,
                    registration.state,
                    registration.promised_by,
                    done and done.occurred_at,
                )
            )
    assert late == []
