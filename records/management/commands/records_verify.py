from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from records.interactions import records_verify
from records.models import RecordObject


class Command(BaseCommand):
    help = (
        "Verify every transcript object against its row, the audit event that recorded its "
        "checksums, and its seal; exit 1 and name the first object that fails, and why."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--use-case", type=int, help="only this use case's objects")

    def handle(self, *args: Any, **options: Any) -> None:
        objects = RecordObject.objects.order_by("pk")
        if options["use_case"] is not None:
            objects = objects.filter(use_case_id=options["use_case"])
        checked = 0
        for obj in objects.iterator(chunk_size=500):
            verdict = records_verify(obj)
            if not verdict.ok:
                self.stderr.write(
                    f"record object FAILS verification: {obj.key} (use case {obj.use_case_id}, "
                    f"{obj.records} records): {verdict.problem} ({checked} verified before it)"
                )
                sys.exit(1)
            checked += 1
        self.stdout.write(f"record objects intact: {checked} verified")
