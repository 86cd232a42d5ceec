"""Rotating the records keys the way docs/records.md says keeps everything they sealed
usable: S3 credential secrets (the S3 endpoint checks signatures with them), webhook signing
secrets and transcript objects (issue 24, defect 12).

The safe order: put the new key first and keep the old one as retired, run
``manage.py records_rewrap`` (re-seals what the old key sealed), check that nothing is left
under a retired key (``records_rewrap --check``), then remove the old key. Removing it
without the re-wrap is what broke uploads (a 500) and webhook signing.

Real parts throughout: an S3 endpoint process on SeaweedFS signing-checked by boto3, a local
webhook receiver verifying Standard Webhooks signatures, transcripts persisted from a real
Valkey stream into a real bucket.
"""

from __future__ import annotations

import base64
import os
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import boto3
import pytest
import valkey
from botocore.config import Config
from django.core.management import call_command
from django.utils import timezone

from governance.audit import Actor
from governance.models import FileRegistration, PriorityClass, S3Credential, SlaClass, UseCase
from governance.roles import Role
from ops.seaweed import SeaweedServer
from records.interactions import records_persist, records_verify
from records.models import InteractionRecord, RecordObject
from records.sealing import SealError
from scheduler.files.s3_credentials import s3_credential_issue, secret_of
from scheduler.files.webhook_settings import webhook_set
from scheduler.files.webhooks import webhook_deliver
from testkit.database import database_url
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.file_jobs_world import (
    WebhookReceiver,
    allow_receivers,
    verify_standard_webhook,
)
from testkit.records_store import RecordsStore
from tests.records.test_records import add_record, transcript
from tests.s3endpoint.conftest import running_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def new_key(kid: str) -> str:
    return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"


OLD, NEW = new_key("2025"), new_key("2026")


class Sealed:
    """What the old key sealed: alice's S3 credential, the use case's webhook secret, and
    one transcript object."""

    def __init__(self, receiver: WebhookReceiver, valkey_client: valkey.Valkey) -> None:
        acme = make_tenant("acme")
        whisper = make_model("whisper", capabilities=["transcription"])
        self.use_case = make_use_case(acme, f"calls-{uuid.uuid4().hex[:6]}", models=(whisper,))
        alice = Actor.for_user(make_user("alice", Role.DEVELOPER, tenants=(acme,)))
        credential, self.s3_secret = s3_credential_issue(
            actor=alice, use_case=self.use_case, name="uploader"
        )
        self.access_key_id = credential.access_key_id
        webhook_secret = webhook_set(actor=alice, use_case=self.use_case, url=receiver.url)
        assert webhook_secret is not None
        self.webhook_secret = webhook_secret
        add_record(valkey_client, "r-old", use_case_id=self.use_case.pk, tenant="acme")
        records_persist(client=valkey_client, consumer="w1")
        self.object = RecordObject.objects.get()

    def credential(self) -> S3Credential:
        return S3Credential.objects.get(access_key_id=self.access_key_id)

    def ended_registration(self) -> FileRegistration:
        return FileRegistration.objects.create(
            use_case=self.use_case,
            registered_by="alice",
            kind="audio",
            filename="done.wav",
            model=self.use_case.allowed_models.get(),
            declared_bytes=10,
            state="done",
            estimated_tokens=10,
            promised_by=timezone.now() + timedelta(hours=1),
        )


def rewrap(*args: str) -> str:
    out = StringIO()
    call_command("records_rewrap", *args, stdout=out, stderr=out)
    return out.getvalue()


def upload(endpoint_url: str, sealed: Sealed, body: bytes) -> None:
    """alice uploads a registered file with her (issued, sealed) credential."""
    sla = SlaClass.objects.create(
        use_case=sealed.use_case,
        name="hourly",
        turnaround_seconds=3600,
        priority_class=PriorityClass.objects.get_or_create(
            name="batch", defaults={"rank": 3, "vllm_priority": 100}
        )[0],
        kinds=["audio"],
        max_file_bytes=1024 * 1024,
    )
    registration = FileRegistration.objects.create(
        use_case=sealed.use_case,
        registered_by="alice",
        kind="audio",
        filename="call.wav",
        model=sealed.use_case.allowed_models.get(),
        declared_bytes=len(body),
        declared_seconds=10.0,
        sla_class=sla,
        estimated_tokens=100,
        promised_by=timezone.now() + timedelta(hours=1),
    )
    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=sealed.access_key_id,
        aws_secret_access_key=sealed.s3_secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    client.put_object(
        Bucket=f"acme-{sealed.use_case.slug}", Key=f"{registration.pk}/call.wav", Body=body
    )


def test_rotation_with_rewrap_keeps_uploads_webhooks_and_transcripts_working(
    settings: Any,
    seaweed: SeaweedServer,
    valkey_url: str,
    valkey_client: valkey.Valkey,
    records_store: RecordsStore,
) -> None:
    # GIVEN everything sealed under the old key
    allow_receivers(settings)  # the receiver is on loopback
    settings.RECORDS_KEYS = OLD
    with WebhookReceiver() as receiver:
        sealed = Sealed(receiver, valkey_client)
        old_object_key = sealed.object.key

        # WHEN the new key goes first with the old one retired, as the docs say
        settings.RECORDS_KEYS = f"{NEW},{OLD}"
        # THEN the check names what is still under the retired key
        with pytest.raises(SystemExit) as left:
            rewrap("--check")
        assert left.value.code == 1

        # WHEN the re-wrap runs: it reports what it re-sealed, and a second run finds nothing
        first = rewrap()
        assert "s3_credentials=1" in first
        assert "webhook_secrets=1" in first
        assert "objects=1" in first
        second = rewrap()
        assert "s3_credentials=0 webhook_secrets=0 objects=0" in second
        rewrap("--check")  # exits 0: nothing left under a retired key

        # AND the old key is removed
        settings.RECORDS_KEYS = NEW

        # THEN webhook deliveries are signed with the secret the team was given
        registration = sealed.ended_registration()
        assert webhook_deliver(registration.pk, "file.done", "msg_rotated") == "delivered"
    [(headers, body)] = receiver.received
    assert verify_standard_webhook(sealed.webhook_secret, headers, body)

    # AND the transcript still verifies against the audit trail and reads back
    obj = RecordObject.objects.get()
    assert obj.key_id == NEW.split(":")[0]
    assert records_verify(obj).ok, records_verify(obj).problem
    assert transcript("r-old")["record_id"] == "r-old"
    assert InteractionRecord.objects.get(record_id="r-old").object_id == obj.pk
    stored = {item["Key"] for item in records_store.client().list_objects_v2(
        Bucket=records_store.bucket).get("Contents", [])}  # fmt: skip
    assert stored == {obj.key}  # the copy under the old key is gone
    assert old_object_key not in stored

    # AND alice's credential still uploads through an endpoint that only has the new key
    with running_endpoint(
        seaweed, valkey_url, database_url(), SWITCHYARD_RECORDS_KEYS=NEW
    ) as endpoint:
        upload(endpoint.url, sealed, b"RIFF" + os.urandom(1000))
    assert secret_of(sealed.credential()) == sealed.s3_secret


def test_removing_the_old_key_without_the_rewrap_breaks_what_it_sealed(
    settings: Any, valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    """The failure the re-wrap prevents: the documented rotation used to stop here."""
    allow_receivers(settings)  # the receiver is on loopback
    settings.RECORDS_KEYS = OLD
    with WebhookReceiver() as receiver:
        sealed = Sealed(receiver, valkey_client)
        settings.RECORDS_KEYS = NEW  # rotated, and the old key dropped, with no re-wrap
        with pytest.raises(SealError):
            secret_of(sealed.credential())
        with pytest.raises(SealError):
            webhook_deliver(sealed.ended_registration().pk, "file.done", "msg_1")
    assert not records_verify(RecordObject.objects.get()).ok
    assert UseCase.objects.get(pk=sealed.use_case.pk).webhook_secret_sealed
