"""`make up` end to end: the whole embedded stack starts, serves the demo, and stops cleanly."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time

import boto3
import httpx
import openai
import pytest

from ops.processes import PYTHON, REPO_ROOT, wait_until
from ops.seaweed import SeaweedPorts
from testkit.stack_ports import port_is_listening, stack_env, stack_ports


@pytest.fixture
def ports() -> dict[str, int]:
    return stack_ports()


def _as_a_background_job() -> None:
    # What a shell does to a job it starts with "&": SIGINT ignored, inherited by the stack.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# A whole stack's start-up may take its full 150 s on a busy machine, then the stop.
@pytest.mark.timeout(300)
def test_the_stack_serves_the_demo_and_stops_every_process_on_ctrl_c(tmp_path, ports) -> None:
    """The demo answers; Ctrl-C (SIGINT) stops every process, even when the stack was started
    with SIGINT ignored, as a shell starts a background job."""
    log = (tmp_path / "stack.out").open("w+")
    stack = subprocess.Popen(
        [PYTHON, "-m", "ops.stack"],
        cwd=REPO_ROOT,
        env=stack_env(tmp_path, ports),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_as_a_background_job,
    )
    try:

        def output() -> str:
            return (tmp_path / "stack.out").read_text()

        assert wait_until(
            lambda: "Press Ctrl-C" in output() or stack.poll() is not None, timeout=150
        )
        assert stack.poll() is None, output()
        key = re.search(r"API key: (sk-sy-\S+)", output()).group(1)
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        assert f"{gateway}/v1" in output()
        assert "from openai import OpenAI" in output()

        client = openai.OpenAI(base_url=gateway + "/v1", api_key=key, max_retries=0)
        assert {m.id for m in client.models.list()} == {
            "llama-3.1-8b-instruct",
            "minilm-l6-embed",
            "whisper-large-v3",
        }
        reply = client.chat.completions.create(
            model="llama-3.1-8b-instruct",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=5,
        )
        assert reply.choices[0].message.content
        streamed = client.chat.completions.create(
            model="llama-3.1-8b-instruct",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=5,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=gateway + "/v1", api_key="sk-sy-wrong", max_retries=0
            ).models.list()

        guardrails = httpx.get(f"http://127.0.0.1:{ports['guardrails']}/healthz").json()
        assert guardrails["status"] == "ok"
        assert guardrails["workers"] == guardrails["size"] >= 1

        # The records bucket exists at start-up, on SeaweedFS, under the run directory.
        s3_url = f"http://127.0.0.1:{ports['s3']}"
        assert (
            f"S3          {s3_url} (object storage: SeaweedFS, bucket switchyard-records)"
            in output()
        )
        s3 = boto3.client(
            "s3",
            endpoint_url=s3_url,
            aws_access_key_id="switchyard-demo",
            aws_secret_access_key="embedded-demo-only-s3-secret",
            region_name="us-east-1",
        )
        assert "switchyard-records" in {b["Name"] for b in s3.list_buckets()["Buckets"]}
        # Switchyard's own S3 endpoint is up, and the files bucket it writes to exists.
        s3_endpoint = f"http://127.0.0.1:{ports['s3_endpoint']}"
        assert f"S3 uploads  {s3_endpoint} (Switchyard's S3 endpoint" in output()
        assert httpx.get(s3_endpoint + "/healthz").status_code == 200
        assert "switchyard-files" in {b["Name"] for b in s3.list_buckets()["Buckets"]}
        assert (tmp_path / "run" / "seaweedfs" / "data").is_dir()
        assert (tmp_path / "run" / "logs" / "seaweedfs.log").is_file()

        web = f"http://127.0.0.1:{ports['web']}"
        assert "llama-3.1-8b-instruct" in httpx.get(web + "/").text
        assert httpx.get(web + "/admin/login/").status_code == 200
        assert httpx.get(web + "/static/admin/css/base.css").status_code == 200
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            code = stack.wait(timeout=40)
        except subprocess.TimeoutExpired:
            stack.kill()
            raise
    assert code == 0, output()
    assert "stopped." in output()
    for name, port in ports.items():
        assert not port_is_listening(port), f"{name} port {port} still open after shutdown"
    for port in SeaweedPorts.from_base(ports["s3"]).all():
        assert not port_is_listening(port), f"SeaweedFS port {port} still open after shutdown"


def _refused_start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m ops.stack`` that is expected to refuse to start: its exit and its words."""
    return subprocess.run(
        [PYTHON, "-m", "ops.stack"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_port_in_use_is_reported_with_the_variable_to_change(tmp_path, ports) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", ports["gateway"]))
        blocker.listen()
        started = time.monotonic()
        result = _refused_start(stack_env(tmp_path, ports))
    assert result.returncode == 1
    assert f"port {ports['gateway']}" in result.stderr
    assert "SWITCHYARD_GATEWAY_PORT" in result.stderr
    assert time.monotonic() - started < 30


# A whole stack's start-up may take its full 150 s on a busy machine, then the stop.
@pytest.mark.timeout(300)
def test_seaweedfs_dying_stops_the_stack_with_its_log(tmp_path, ports) -> None:
    """Object storage is a child like the others: if it dies, the stack says which, shows the
    end of its log, and stops everything else rather than limping on without a bucket."""
    import psutil

    log = (tmp_path / "stack.out").open("w+")
    stack = subprocess.Popen(
        [PYTHON, "-m", "ops.stack"],
        cwd=REPO_ROOT,
        env=stack_env(tmp_path, ports),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def output() -> str:
        return (tmp_path / "stack.out").read_text()

    try:
        assert wait_until(
            lambda: "Press Ctrl-C" in output() or stack.poll() is not None, timeout=150
        )
        assert stack.poll() is None, output()
        (weed,) = [
            p
            for p in psutil.Process(stack.pid).children(recursive=True)
            if f"-s3.port={ports['s3']}" in p.cmdline()
        ]
        weed.kill()
        code = stack.wait(timeout=60)
    finally:
        if stack.poll() is None:
            stack.kill()
    assert code == 1
    assert "seaweedfs exited unexpectedly; stopping the stack." in output()
    assert f"--- last lines of {tmp_path / 'run' / 'logs' / 'seaweedfs.log'} ---" in output()
    for name, port in ports.items():
        assert not port_is_listening(port), f"{name} port {port} still open after the stop"


def test_a_clash_on_a_seaweedfs_grpc_port_names_the_s3_port_variable(tmp_path, ports) -> None:
    """SeaweedFS listens on the S3 port's neighbours and their gRPC twins: a clash on any is
    named by the one variable that moves them all."""
    filer_grpc = SeaweedPorts.from_base(ports["s3"]).filer + 10_000
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", filer_grpc))
        blocker.listen()
        result = _refused_start(stack_env(tmp_path, ports))
    assert result.returncode == 1
    assert f"port {filer_grpc}" in result.stderr
    assert "SWITCHYARD_S3_PORT" in result.stderr


def test_an_s3_port_without_room_for_its_neighbours_is_refused(tmp_path, ports) -> None:
    env = {**stack_env(tmp_path, ports), "SWITCHYARD_S3_PORT": "60000"}
    result = _refused_start(env)
    assert result.returncode == 2
    assert "SWITCHYARD_S3_PORT=60000 must be at most 55531" in result.stderr
