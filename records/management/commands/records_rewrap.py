from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from records.rewrap import records_rewrap
from records.sealing import keyring


class Command(BaseCommand):
    help = (
        "Re-seal under the current records key (the first of SWITCHYARD_RECORDS_KEYS) "
        "everything a retired key sealed: S3 credential secrets, webhook signing secrets and "
        "transcript objects. Safe to run again; run it after adding a new key and before "
        "removing the old one. --check changes nothing and exits 1 while anything is left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="only count what is still sealed under a retired key; exit 1 if anything is",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ring = keyring()
        check = bool(options["check"])
        report = records_rewrap(check_only=check, ring=ring)
        retired = ", ".join(ring.retired) or "none"
        verb = "still under a retired key" if check else "re-sealed"
        self.stdout.write(
            f"current key {report.current} (retired: {retired}); {verb}: {report.summary()}"
        )
        for problem in report.failed:
            self.stderr.write(f"not re-sealed: {problem}")
        if report.failed or (check and report.left):
            sys.exit(1)
