"""``manage.py ensure_buckets``: what the stack and a production deploy run before the workers."""

from __future__ import annotations

import os
import subprocess

from ops.processes import PYTHON, REPO_ROOT


def ensure_buckets(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", "ensure_buckets"],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_records_bucket_is_created_once_and_a_second_run_is_a_no_op(records_store) -> None:
    s3 = records_store.client()
    assert records_store.bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    first, second = ensure_buckets(records_store.env), ensure_buckets(records_store.env)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert f"records storage ready: {records_store.bucket}" in second.stdout
    assert records_store.bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_a_wrong_secret_fails_loudly_naming_the_bucket_and_the_settings(records_store) -> None:
    """SeaweedFS checks the signature: a deploy with the wrong secret stops here."""
    result = ensure_buckets({**records_store.env, "SWITCHYARD_S3_SECRET_ACCESS_KEY": "wrong"})

    assert result.returncode != 0
    assert f"cannot reach the records bucket '{records_store.bucket}'" in result.stderr
    assert "SWITCHYARD_S3_" in result.stderr
    s3 = records_store.client()
    assert records_store.bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
