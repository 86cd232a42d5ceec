"""What the file-job tests share: real inputs (a WAV of tones and silences, a hand-made PDF with
a text layer), the governance records a job needs, and the steps of the flow."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import io
import threading
import time
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import valkey

from governance.audit import Actor
from governance.models import FileRegistration, Model, PriorityClass, PriorityRule, SlaClass
from runtime.outbound_urls import ALLOWED_NETWORKS_VARIABLE, parse_networks
from scheduler.files.dispatch import file_jobs_dispatch
from scheduler.files.jobs import file_job_run
from scheduler.files.objects import FilesStore
from scheduler.files.registration import file_register
from scheduler.files.upload_events import UploadEvent, publish_upload, upload_object_name
from scheduler.files.uploads import uploads_consume

SYSTEM = Actor.system("tests")


def make_wav(tones: list[float], *, silence: float = 0.8, rate: int = 44_100) -> bytes:
    """Stereo 16-bit tones of the given lengths (s), each followed by ``silence`` seconds."""
    pieces = []
    for index, seconds in enumerate(tones):
        t = np.arange(int(seconds * rate)) / rate
        pieces.append(0.5 * np.sin(2 * np.pi * (330 + 110 * index) * t))
        pieces.append(np.zeros(int(silence * rate)))
    mono = (np.concatenate(pieces) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.repeat(mono[:, None], 2, axis=1).tobytes())
    return buffer.getvalue()


def make_pdf(pages: list[str]) -> bytes:
    """A small, valid PDF with one line of Helvetica text per page (empty: a page with no
    text layer, as a scan would be)."""
    objects: list[bytes] = []
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for index, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode() if text else b""
        objects.append(
            (
                f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * index} 0 R >>"
            ).encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def seed_priority(*, batch_queue_timeout: float = 600.0) -> dict[str, PriorityClass]:
    """The classes the tests speak of (a transactional test's flush removes the migration's):
    interactive production traffic ranks first, ``low`` next, ``batch`` last."""
    classes = {}
    for name, rank, timeout in (
        ("critical", 0, 30.0),
        ("low", 3, 30.0),
        ("batch", 4, batch_queue_timeout),
    ):
        classes[name], _ = PriorityClass.objects.update_or_create(
            name=name,
            defaults={
                "rank": rank,
                "vllm_priority": rank,
                "queue_timeout_seconds": timeout,
                "max_queue_length": 1000,
            },
        )
    PriorityRule.objects.update_or_create(
        environment="prod", namespace="prod", defaults={"priority_class": classes["critical"]}
    )
    return classes


def sla_class(use_case: Any, name: str, priority: PriorityClass, **fields: Any) -> SlaClass:
    values: dict[str, Any] = {
        "turnaround_seconds": 3600,
        "kinds": ["audio", "pdf", "text"],
        "max_file_bytes": 10**9,
        **fields,
    }
    return SlaClass.objects.create(use_case=use_case, name=name, priority_class=priority, **values)


def register(
    use_case: Any, model: Model, kind: str, filename: str, content: bytes, **fields: Any
) -> FileRegistration:
    return file_register(
        actor=SYSTEM,
        use_case=use_case,
        kind=kind,
        filename=filename,
        model=model,
        declared_bytes=len(content),
        **fields,
    ).file


def upload(
    client: valkey.Valkey,
    registration: FileRegistration,
    content: bytes,
    *,
    at: float | None = None,
) -> UploadEvent:
    """What the S3 endpoint does on a completed upload: the object, then the event."""
    use_case = registration.use_case
    name = upload_object_name(
        use_case.tenant.slug, use_case.slug, registration.pk, registration.filename
    )
    FilesStore().write(name, content)
    event = UploadEvent(
        registration_id=registration.pk,
        object_name=name,
        size=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
        etag="",
        uploader="s3:TESTKEY",
        uploaded_at=at if at is not None else time.time(),
    )
    publish_upload(client, event)
    return event


@dataclass
class Ran:
    dispatched: list[int] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)


def run_in_process(client: valkey.Valkey) -> Ran:
    """One turn of the beat's two tasks, the dispatched jobs run here (no worker)."""
    uploads_consume(client=client)
    handed: list[tuple[int, str]] = []
    file_jobs_dispatch(client=client, send=lambda pk, token: handed.append((pk, token)))
    ran = Ran(dispatched=[pk for pk, _ in handed])
    for pk, token in handed:
        ran.outcomes[pk] = file_job_run(pk, token, client=client)
    return ran


# The receivers below listen on loopback, which webhooks and callbacks reach only where an
# operator allows it (runtime/outbound_urls.py): tests allow it in-process with
# ``allow_receivers(settings)`` and in the processes they start with ``RECEIVER_ENV``.
RECEIVER_NETWORKS = "127.0.0.1/32"
RECEIVER_ENV = {ALLOWED_NETWORKS_VARIABLE: RECEIVER_NETWORKS}


def allow_receivers(settings: Any) -> None:
    """Let this process's webhooks reach the loopback receivers (pytest-django's settings)."""
    settings.WEBHOOK_ALLOWED_NETWORKS = parse_networks([RECEIVER_NETWORKS])


class WebhookReceiver:
    """A real local HTTP server that takes webhook POSTs: answers ``statuses`` in turn (then
    200) and keeps each request's headers and body."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/files"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The receiver's side of the Standard Webhooks spec, written from the spec (not from
    scheduler/files/webhooks.py): HMAC-SHA256 over ``id.timestamp.body`` with the base64-decoded
    secret after ``whsec_``, compared in constant time with each ``v1,`` signature."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        version == "v1" and hmac.compare_digest(signature, expected)
        for version, _, signature in (
            part.partition(",") for part in headers["webhook-signature"].split(" ")
        )
    )
