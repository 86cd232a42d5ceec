"""The batch pipeline (scheduler/files/pipelines/batch.py) run part by part against a real
gateway in front of the simulator, with a real key: the output and error files in OpenAI's
batch format, field by field, and each recorded as an ApiFile of the batch's use case.

The job runner (scheduler/files/jobs.py) is not part of this: the parts are run here, through
the runner's own GatewayClient and FilesStore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.files.storage import storages
from rest_framework.test import APIClient

from governance.models import ApiFile, FileRegistration, PriorityClass, SlaClass
from governance.snapshot import snapshot_publish
from scheduler.files.gateway_client import GatewayClient
from scheduler.files.objects import FilesStore
from scheduler.files.pipelines import batch as batch_module
from scheduler.files.pipelines.base import PIPELINES, JobContext, Retryable
from testkit.factories import make_key, make_model, make_tenant, make_use_case
from testkit.openai_batch import chat_line, jsonl
from tests.conftest import GatewayFactory, SimulatorFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(
    settings: Any,
    tmp_path: Path,
    valkey_url: str,
    valkey_client: Any,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> dict[str, Any]:
    settings.VALKEY_URL = valkey_url
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files"), "allow_overwrite": True},
        },
    }
    replica = start_simulator("llama", "--time-scale", "0")
    llama = make_model("llama", replicas=[replica.base_url], capabilities=["chat"])
    use_case = make_use_case(make_tenant("acme"), "assistant", models=(llama,))
    key, secret = make_key(use_case)
    limited = make_use_case(
        make_tenant("globex"), "limited", models=(llama,), requests_per_minute=1
    )
    limited_secret = make_key(limited)[1]
    snapshot_publish()
    sla = SlaClass.objects.create(
        use_case=use_case,
        name="day",
        turnaround_seconds=86400,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    registration = FileRegistration.objects.create(
        use_case=use_case,
        registered_by="key:test",
        api_key=key,
        kind="batch",
        filename="requests.jsonl",
        model=llama,
        declared_bytes=1,
        declared_lines=1,
        sla_class=sla,
        estimated_tokens=1,
        promised_by="2099-01-01T00:00:00Z",
        request_endpoint="/v1/chat/completions",
    )
    gateway = start_gateway()
    return {
        "secret": secret,
        "gateway": GatewayClient(gateway.base_url, secret),
        "limited": GatewayClient(gateway.base_url, limited_secret),
        "registration": registration,
        "use_case": use_case,
    }


def job_for(registration: FileRegistration, source: str) -> JobContext:
    return JobContext(
        registration_id=registration.pk,
        kind="batch",
        model="llama",
        models=["llama"],
        filename="requests.jsonl",
        source_object=source,
        output_prefix=f"uploads/acme/assistant/{registration.pk}/out/",
        request_endpoint="/v1/chat/completions",
    )


def test_lines_run_through_the_gateway_into_openai_output_and_error_files(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_module, "LINES_PER_PART", 2)
    store = FilesStore()
    lines = [chat_line("a", max_tokens=4), chat_line("b", max_tokens=4), chat_line("c")]
    # The gateway refuses this one (no messages): a line's error, not the part's.
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "llama"}})  # fmt: skip
    lines.append(chat_line("e", max_tokens=4))
    source = f"uploads/acme/assistant/{world['registration'].pk}/requests.jsonl"
    store.write(source, jsonl(lines))
    job = job_for(world["registration"], source)
    pipeline = PIPELINES["batch"]

    specs = pipeline.plan(job, store)
    assert [spec["lines"] for spec in specs] == [2, 2, 1]
    parts = [
        pipeline.run_part(job, spec, index, world["gateway"], store)
        for index, spec in enumerate(specs)
    ]
    assert [dict(part.counts) for part in parts] == [
        {"total": 2, "completed": 2, "failed": 0},
        {"total": 2, "completed": 1, "failed": 1},
        {"total": 1, "completed": 1, "failed": 0},
    ]
    assert all(part.tokens > 0 for part in parts)
    # A part run again writes the same lines (deterministic ids): a retry is harmless.
    again = pipeline.run_part(job, specs[0], 0, world["gateway"], store)
    assert [orjson.loads(x)["id"] for x in store.read(again.output_object).splitlines()] == [
        orjson.loads(x)["id"] for x in store.read(parts[0].output_object).splitlines()
    ]

    outputs, counts = pipeline.finish(job, parts, store)

    assert counts == {"total": 5, "completed": 4, "failed": 1}
    output = ApiFile.objects.get(public_id=outputs["output_file_id"])
    errors = ApiFile.objects.get(public_id=outputs["error_file_id"])
    assert (output.purpose, errors.purpose) == ("batch_output", "batch_error")
    assert output.use_case == errors.use_case == world["use_case"]
    answered = [orjson.loads(x) for x in store.read(output.object_name).splitlines()]
    assert [line["custom_id"] for line in answered] == ["a", "b", "c", "e"]
    for line in answered:
        assert set(line) == {"id", "custom_id", "response", "error"}
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"] == line["response"]["body"]["id"]
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["model"] == "llama"
        assert line["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    assert len({line["id"] for line in answered}) == 4
    (refused,) = [orjson.loads(x) for x in store.read(errors.object_name).splitlines()]
    assert refused["custom_id"] == "bad"
    assert refused["error"] is None
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["request_id"]
    assert refused["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert output.bytes == len(store.read(output.object_name))
    # The use case's key downloads both through /v1/files, and lists them.
    client: Any = APIClient()  # its responses here are streamed (no stubs for that)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world['secret']}")
    for file in (output, errors):
        got = client.get(f"/v1/files/{file.public_id}/content")
        assert b"".join(got.streaming_content) == store.read(file.object_name)
    listed = client.get("/v1/files", {"purpose": "batch_output"}).json()["data"]
    assert [f["id"] for f in listed] == [output.public_id]
    # finish run again finds the same files instead of making new ones.
    assert pipeline.finish(job, parts, store) == (outputs, counts)
    assert ApiFile.objects.count() == 2


def test_a_batch_with_no_failures_has_no_error_file(world: dict[str, Any]) -> None:
    store = FilesStore()
    source = f"uploads/acme/assistant/{world['registration'].pk}/requests.jsonl"
    store.write(source, jsonl([chat_line("only", max_tokens=2)]))
    job = job_for(world["registration"], source)
    pipeline = PIPELINES["batch"]
    parts = [
        pipeline.run_part(job, spec, index, world["gateway"], store)
        for index, spec in enumerate(pipeline.plan(job, store))
    ]
    outputs, counts = pipeline.finish(job, parts, store)
    assert set(outputs) == {"output_file_id"}
    assert counts == {"total": 1, "completed": 1, "failed": 0}


def test_a_rate_limited_request_makes_the_part_retryable_not_a_line_error(
    world: dict[str, Any],
) -> None:
    store = FilesStore()
    source = f"uploads/acme/assistant/{world['registration'].pk}/requests.jsonl"
    store.write(source, jsonl([chat_line(str(n), max_tokens=2) for n in range(3)]))
    job = job_for(world["registration"], source)
    pipeline = PIPELINES["batch"]
    (spec,) = pipeline.plan(job, store)

    # One request a minute: the second or third is refused with 429.
    with pytest.raises(Retryable):
        pipeline.run_part(job, spec, 0, world["limited"], store)
    assert not storages["files"].exists(f"{job.output_prefix}parts/out-00000.jsonl")


def test_a_line_for_another_endpoint_is_an_error_line_and_never_sent(
    world: dict[str, Any],
) -> None:
    """A batch uploaded over S3 was never checked line by line: a line naming a path that is
    not a batch endpoint (here the files API) is answered as an error, not called."""
    store = FilesStore()
    source = f"uploads/acme/assistant/{world['registration'].pk}/requests.jsonl"
    lines = [{**chat_line("files"), "url": "/v1/files"}, chat_line("ok", max_tokens=2)]
    store.write(source, jsonl(lines))
    job = job_for(world["registration"], source)
    pipeline = PIPELINES["batch"]
    parts = [
        pipeline.run_part(job, spec, index, world["gateway"], store)
        for index, spec in enumerate(pipeline.plan(job, store))
    ]
    outputs, counts = pipeline.finish(job, parts, store)
    assert counts == {"total": 2, "completed": 1, "failed": 1}
    errors = ApiFile.objects.get(public_id=outputs["error_file_id"])
    (line,) = [orjson.loads(x) for x in store.read(errors.object_name).splitlines()]
    assert line["custom_id"] == "files"
    assert line["response"] is None
    assert line["error"]["code"] == "invalid_url"
