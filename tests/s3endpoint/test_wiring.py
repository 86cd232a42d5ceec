"""The endpoint's place in the stack: its port is checked like the others, and the files
bucket it writes to is created by ``ensure_buckets``."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from ops.processes import free_port
from ops.stack import StackConfig, StackError, check_ports
from tests.records.test_ensure_buckets import ensure_buckets


def test_a_taken_s3_endpoint_port_is_named_with_its_setting(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        config = StackConfig(
            host="127.0.0.1",
            web_port=free_port(),
            gateway_port=free_port(),
            guardrail_port=free_port(),
            valkey_port=free_port(),
            fleet_base_port=free_port(),
            run_dir=tmp_path,
            sim_time_scale=1.0,
        )
        # Every other port far from anything listening; only the endpoint's is taken.
        config = dataclasses.replace(config, s3_endpoint_port=taken, s3_port=free_port())
        with pytest.raises(StackError) as caught:
            check_ports(config)
    assert f"port {taken} on 127.0.0.1 is already in use" in str(caught.value)
    assert "SWITCHYARD_S3_ENDPOINT_PORT" in str(caught.value)


def test_ensure_buckets_creates_the_files_bucket(records_store: Any) -> None:
    files_bucket = f"t-files-{uuid.uuid4().hex[:8]}"
    result = ensure_buckets({**records_store.env, "SWITCHYARD_FILES_BUCKET": files_bucket})
    assert result.returncode == 0, result.stderr
    assert f"files storage ready: {files_bucket}" in result.stdout
    names = {bucket["Name"] for bucket in records_store.client().list_buckets()["Buckets"]}
    assert files_bucket in names
