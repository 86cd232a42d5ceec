"""A real S3 endpoint process (uvicorn) in front of the session's SeaweedFS, on the test's
database and Valkey; personas and registrations to upload for.

alice develops for acme's ``transcribe`` use case and holds its S3 credential; globex's
``other`` use case is someone else's bucket.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.config import Config
from django.utils import timezone

from governance.audit import Actor
from governance.models import FileRegistration, PriorityClass, SlaClass, UseCase
from governance.roles import Role
from ops.processes import ManagedProcess, free_port, http_ready, s3_endpoint_command
from ops.seaweed import SeaweedServer
from scheduler.files.s3_credentials import s3_credential_issue
from testkit.database import database_url
from testkit.factories import make_model, make_tenant, make_use_case, make_user

RECORDS_KEYS = "s3test:" + base64.b64encode(b"k" * 32).decode()
PRESIGN_SECRET = "presign-secret-for-the-s3-endpoint-tests"
CREDENTIAL_TTL = 1.0


@dataclass(frozen=True)
class Endpoint:
    url: str
    files_bucket: str
    process: ManagedProcess
    seaweed: SeaweedServer

    def store(self) -> Any:
        """A client on the backing store itself, to look behind the endpoint."""
        return boto3.client(
            "s3",
            endpoint_url=self.seaweed.endpoint_url,
            aws_access_key_id=self.seaweed.access_key,
            aws_secret_access_key=self.seaweed.secret_key,
            region_name="us-east-1",
        )


@contextmanager
def running_endpoint(
    seaweed: SeaweedServer, valkey_url: str, db: str, **env: str
) -> Iterator[Endpoint]:
    """An S3 endpoint process on ``valkey_url`` and a bucket of its own; ``env`` adds to or
    overrides its settings."""
    bucket = f"s3e-files-{uuid.uuid4().hex[:8]}"
    port = free_port()
    process = ManagedProcess(
        "s3endpoint",
        s3_endpoint_command("127.0.0.1", port),
        env={
            "SWITCHYARD_DATABASE_URL": db,
            "SWITCHYARD_VALKEY_URL": valkey_url,
            "SWITCHYARD_S3_ENDPOINT_URL": seaweed.endpoint_url,
            "SWITCHYARD_S3_ACCESS_KEY_ID": seaweed.access_key,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": seaweed.secret_key,
            "SWITCHYARD_FILES_BUCKET": bucket,
            "SWITCHYARD_RECORDS_KEYS": RECORDS_KEYS,
            "SWITCHYARD_S3_PRESIGN_SECRET": PRESIGN_SECRET,
            "SWITCHYARD_S3_CREDENTIAL_CACHE_SECONDS": str(CREDENTIAL_TTL),
            "SWITCHYARD_S3_ENDPOINT_CORS_ORIGINS": "http://portal.test",
            **env,
        },
    )
    endpoint = Endpoint(f"http://127.0.0.1:{port}", bucket, process, seaweed)
    endpoint.store().create_bucket(Bucket=bucket)
    process.start(http_ready(endpoint.url + "/healthz", expect=200), timeout=30)
    try:
        yield endpoint
    finally:
        process.stop()


@pytest.fixture(scope="module")
def s3_endpoint(
    seaweed: SeaweedServer, valkey_url: str, django_db_setup: Any, django_db_blocker: Any
) -> Iterator[Endpoint]:
    with django_db_blocker.unblock():
        db = database_url()
    with running_endpoint(seaweed, valkey_url, db) as endpoint:
        yield endpoint


@dataclass
class World:
    endpoint: Endpoint
    use_case: UseCase
    other: UseCase
    access_key_id: str
    secret: str
    bucket: str
    sla: SlaClass

    def client(
        self, access_key_id: str | None = None, secret: str | None = None, **config: Any
    ) -> Any:
        """boto3 with its installed defaults (checksums, payload modes), path-style."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint.url,
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret or self.secret,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
        )

    def register(
        self,
        filename: str = "call.wav",
        declared_bytes: int = 1000,
        use_case: UseCase | None = None,
    ) -> FileRegistration:
        use_case = use_case or self.use_case
        return FileRegistration.objects.create(
            use_case=use_case,
            registered_by="alice",
            kind="audio",
            filename=filename,
            model=use_case.allowed_models.get(),
            declared_bytes=declared_bytes,
            declared_seconds=10.0,
            sla_class=self.sla if use_case == self.use_case else None,
            estimated_tokens=100,
            promised_by=timezone.now() + timedelta(hours=1),
        )

    def stored(self, registration: FileRegistration) -> bytes | None:
        name = (
            f"uploads/{self.use_case.tenant.slug}/{self.use_case.slug}/"
            f"{registration.pk}/{registration.filename}"
        )
        try:
            return bytes(
                self.endpoint.store()
                .get_object(Bucket=self.endpoint.files_bucket, Key=name)["Body"]
                .read()
            )
        except self.endpoint.store().exceptions.NoSuchKey:
            return None


@pytest.fixture
def s3_world(settings: Any, valkey_url: str, valkey_client: Any, s3_endpoint: Endpoint) -> World:
    settings.RECORDS_KEYS = RECORDS_KEYS
    settings.S3_PRESIGN_SECRET = PRESIGN_SECRET
    settings.VALKEY_URL = valkey_url
    settings.FILES_BUCKET = s3_endpoint.files_bucket
    settings.S3_ENDPOINT_PUBLIC_URL = s3_endpoint.url
    acme, globex = make_tenant("acme"), make_tenant("globex")
    whisper = make_model("whisper", capabilities=["transcription"])
    # Slugs of their own: the files bucket is shared by the module's tests.
    unique = uuid.uuid4().hex[:6]
    transcribe = make_use_case(acme, f"transcribe-{unique}", models=(whisper,))
    other = make_use_case(globex, f"other-{unique}", models=(whisper,))
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    sla = SlaClass.objects.create(
        use_case=transcribe,
        name="hourly",
        turnaround_seconds=3600,
        priority_class=PriorityClass.objects.get_or_create(
            name="batch", defaults={"rank": 3, "vllm_priority": 100}
        )[0],
        kinds=["audio"],
        max_file_bytes=64 * 1024 * 1024,
    )
    credential, secret = s3_credential_issue(
        actor=Actor.for_user(alice), use_case=transcribe, name="uploader"
    )
    return World(
        endpoint=s3_endpoint,
        use_case=transcribe,
        other=other,
        access_key_id=credential.access_key_id,
        secret=secret,
        bucket=f"acme-transcribe-{unique}",
        sla=sla,
    )


def _self_signed(directory: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1, so boto3 talks TLS to the endpoint as it would in
    production (and then sends its default aws-chunked bodies with checksum trailers)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


@dataclass(frozen=True)
class TlsEndpoint:
    url: str
    ca_bundle: str
    process: ManagedProcess


@pytest.fixture(scope="module")
def s3_endpoint_tls(
    s3_endpoint: Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsEndpoint]:
    """A second endpoint process, the same in every way but TLS."""
    import ssl
    import urllib.request

    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    port = free_port()
    process = ManagedProcess(
        "s3endpoint-tls",
        [*s3_endpoint_command("127.0.0.1", port), "--ssl-certfile", cert, "--ssl-keyfile", key],
        env=s3_endpoint.process.env,
    )
    context = ssl.create_default_context(cafile=cert)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/healthz", timeout=1, context=context
            ) as answer:
                return int(answer.status) == 200
        except OSError:
            return False

    process.start(ready, timeout=30)
    try:
        yield TlsEndpoint(f"https://127.0.0.1:{port}", cert, process)
    finally:
        process.stop()
