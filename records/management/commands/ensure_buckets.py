"""``manage.py ensure_buckets``: create the object-storage buckets Switchyard writes to.

The embedded stack runs it once SeaweedFS answers; a production deploy runs it (an init
container, a release step) before the workers start, so that the first record persisted does
not race the bucket's creation and a wrong endpoint or credential fails the deploy loudly
rather than the first transcript quietly.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.files.storage import storages
from django.core.management.base import BaseCommand, CommandError

from records.objects import ensure_bucket, records_storage


class Command(BaseCommand):
    help = "Create the object-storage buckets (records, files) if they are missing."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            storage = records_storage()
        except (BotoCoreError, ClientError) as exc:
            raise CommandError(
                f"cannot reach the records bucket {settings.RECORDS_BUCKET!r} at "
                f"{settings.S3_ENDPOINT_URL or 'AWS S3'}: {exc} (check SWITCHYARD_S3_* settings)"
            ) from exc
        where = getattr(storage, "bucket_name", None) or getattr(storage, "location", "")
        self.stdout.write(f"records storage ready: {where}")
        # The files bucket: uploads through the S3 endpoint (s3endpoint/), outputs beside them.
        files = storages["files"]
        try:
            ensure_bucket(files)
        except (BotoCoreError, ClientError) as exc:
            raise CommandError(
                f"cannot reach the files bucket {settings.FILES_BUCKET!r} at "
                f"{settings.S3_ENDPOINT_URL or 'AWS S3'}: {exc} (check SWITCHYARD_S3_* settings)"
            ) from exc
        where = getattr(files, "bucket_name", None) or getattr(files, "location", "")
        self.stdout.write(f"files storage ready: {where}")
