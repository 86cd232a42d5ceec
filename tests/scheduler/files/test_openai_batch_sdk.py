"""The OpenAI SDK, unchanged, against a real gateway that forwards /v1/files and /v1/batches to
a real web process (uvicorn, config.asgi), with SeaweedFS behind the files bucket and a real
Valkey for promises and upload events.

GIVEN acme's ``assistant`` use case (alice's key) with a daily batch SLA class, and globex's
``elsewhere`` (bob's key)
WHEN alice uploads a batch input, creates a batch, lists, reads, cancels and deletes through
``OpenAI(base_url=<gateway>/v1)``
THEN every call answers in OpenAI's shapes, an invalid line is named, bob sees none of it, and
a batch the fleet cannot finish within a day is refused with the earliest possible time.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from governance.models import PriorityClass, SlaClass
from governance.snapshot import snapshot_publish
from scheduler.files.upload_events import UPLOADS_STREAM
from testkit.database import database_url
from testkit.factories import make_key, make_model, make_tenant, make_use_case
from testkit.openai_batch import chat_line, jsonl, sdk_client
from testkit.records_store import RecordsStore
from testkit.stack import RunningGateway
from testkit.web_process import running_web
from tests.conftest import GatewayFactory, SimulatorFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(
    settings: Any,
    tmp_path: Path,
    valkey_url: str,
    valkey_client: Any,
    records_store: RecordsStore,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> Iterator[dict[str, Any]]:
    settings.VALKEY_URL = valkey_url
    replica = start_simulator("llama", "--time-scale", "0")
    llama = make_model("llama", replicas=[replica.base_url], capabilities=["chat"])
    slow = make_model("slow", replicas=[replica.base_url], capabilities=["chat"])
    assistant = make_use_case(make_tenant("acme"), "assistant", models=(llama, slow))
    elsewhere = make_use_case(make_tenant("globex"), "elsewhere", models=(llama,))
    SlaClass.objects.create(
        use_case=assistant,
        name="day",
        turnaround_seconds=24 * 3600,
        # A transactional test before this one flushed the migrations' rows.
        priority_class=PriorityClass.objects.get_or_create(
            name="batch", defaults={"rank": 1, "vllm_priority": 100}
        )[0],
        kinds=["batch"],
    )
    alice, bob = make_key(assistant)[1], make_key(elsewhere)[1]
    snapshot_publish()
    env = {
        **records_store.env,
        "SWITCHYARD_FILES_BUCKET": records_store.bucket,
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_DATABASE_URL": database_url(),
        "SWITCHYARD_RUN_DIR": str(tmp_path),
        # "slow" can never finish a line within a day: its batches are refused.
        "SWITCHYARD_BATCH_MODEL_TOKENS_PER_SECOND": "slow=0.001",
    }
    with running_web(env) as web_url:
        gateway: RunningGateway = start_gateway(SWITCHYARD_CONTROL_URL=web_url)
        yield {
            "gateway": gateway.base_url,
            "alice_key": alice,
            "alice": sdk_client(gateway.base_url, alice),
            "bob": sdk_client(gateway.base_url, bob),
            "valkey": valkey_client,
        }


def test_files_and_batches_round_trip_through_the_gateway(world: dict[str, Any]) -> None:
    alice, bob = world["alice"], world["bob"]
    content = jsonl([chat_line(f"req-{n}") for n in range(3)])

    uploaded = alice.files.create(file=("requests.jsonl", content), purpose="batch")
    assert uploaded.id.startswith("file-")
    assert uploaded.bytes == len(content)
    assert uploaded.purpose == "batch"
    assert alice.files.retrieve(uploaded.id).filename == "requests.jsonl"
    assert [f.id for f in alice.files.list(purpose="batch").data] == [uploaded.id]
    assert alice.files.content(uploaded.id).read() == content

    batch = alice.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "claims"},
    )
    assert batch.status == "validating"
    assert batch.request_counts is not None
    assert batch.request_counts.total == 3
    assert batch.metadata == {"team": "claims"}
    assert world["valkey"].xlen(UPLOADS_STREAM) == 1
    again = alice.batches.retrieve(batch.id)
    assert (again.id, again.input_file_id, again.expires_at) == (
        batch.id,
        uploaded.id,
        batch.expires_at,
    )
    assert [b.id for b in alice.batches.list().data] == [batch.id]

    # bob, of another tenant, sees none of it.
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert bob.files.list().data == []

    with pytest.raises(openai.ConflictError, match=batch.id):
        alice.files.delete(uploaded.id)
    assert alice.batches.cancel(batch.id).status == "cancelled"
    assert alice.batches.retrieve(batch.id).status == "cancelled"
    assert alice.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(uploaded.id)


def test_an_invalid_line_and_an_infeasible_batch_are_refused(world: dict[str, Any]) -> None:
    alice = world["alice"]
    bad = jsonl([chat_line("a"), chat_line("b", model="gpt-4o")])
    with pytest.raises(openai.BadRequestError) as refused:
        alice.files.create(file=("bad.jsonl", bad), purpose="batch")
    assert refused.value.code == "invalid_batch_input"
    assert "line 2: the use case may not use the model 'gpt-4o'" in refused.value.message

    slow = alice.files.create(
        file=("slow.jsonl", jsonl([chat_line("a", model="slow")])), purpose="batch"
    )
    with pytest.raises(openai.ConflictError) as infeasible:
        alice.batches.create(
            input_file_id=slow.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert infeasible.value.code == "infeasible"
    assert "The earliest completion that could be promised" in infeasible.value.message
    assert alice.batches.list().data == []


def test_a_large_input_streams_through_the_gateway_from_curl(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """curl sends a body over 1 MB with ``Expect: 100-continue``, in chunks: the proxy must
    stream it through whole (2 MB here) and the web process store it byte for byte."""
    content = jsonl([chat_line(f"req-{n}", text="x" * 600) for n in range(3000)])
    assert len(content) > 2_000_000
    path = tmp_path / "large.jsonl"
    path.write_bytes(content)
    done = subprocess.run(
        [
            "curl", "-sS", "--fail-with-body", f"{world['gateway']}/v1/files",
            "-H", f"Authorization: Bearer {world['alice_key']}",
            "-F", f"file=@{path}", "-F", "purpose=batch",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    uploaded = orjson.loads(done.stdout)
    assert uploaded["bytes"] == len(content)
    assert world["alice"].files.content(uploaded["id"]).read() == content
    # Refused before its body is read, the large upload still gets the web process's answer.
    wrong = subprocess.run(
        [
            "curl", "-sS", f"{world['gateway']}/v1/files",
            "-H", "Authorization: Bearer sk-sy-wrong", "-F", f"file=@{path}", "-F", "purpose=batch",
            "-o", "-", "-w", "\n%{http_code}",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    body, _, status = wrong.stdout.rpartition(b"\n")
    assert status == b"401", wrong.stdout + wrong.stderr
    assert orjson.loads(body)["error"]["code"] == "invalid_api_key"


def test_a_batch_runs_to_completion_and_its_output_file_is_read_with_the_sdk(
    world: dict[str, Any], records_store: RecordsStore, settings: Any
) -> None:
    """GIVEN a batch created with the SDK, WHEN the file-job machinery runs it (the upload
    consumer, the dispatcher and the runner, in this process: the code a Celery worker runs),
    calling the gateway with the SLA class's job key, THEN ``batches.retrieve`` says completed
    with its counts and ``files.content`` of its output file holds one answer per line, in
    OpenAI's batch output format."""
    from testkit.file_jobs_world import run_in_process

    # This process reads and writes the same bucket as the web process.
    settings.STORAGES = {**settings.STORAGES, "files": settings.STORAGES["records"]}
    settings.FILE_JOBS_GATEWAY_URL = world["gateway"]
    alice = world["alice"]
    content = jsonl([chat_line(f"req-{n}") for n in range(3)])
    uploaded = alice.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = alice.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    for _ in range(5):
        run_in_process(world["valkey"])
        if alice.batches.retrieve(batch.id).status == "completed":
            break
    done = alice.batches.retrieve(batch.id)

    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (3, 3)
    assert done.request_counts.failed == 0
    assert done.completed_at is not None
    assert done.in_progress_at is not None
    assert done.output_file_id is not None
    output = alice.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output"
    lines = [orjson.loads(line) for line in alice.files.content(output.id).read().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["req-0", "req-1", "req-2"]
    for line in lines:
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["choices"][0]["message"]["content"]
