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
from django.core.management.base import BaseCommand, CommandError

from scheduler.record_objects import records_storage


class Command(BaseCommand):
    help = "Create the object-storage buckets (records) if they are missing."

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
