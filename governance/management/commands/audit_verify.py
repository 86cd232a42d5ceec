from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from governance.audit import audit_verify


class Command(BaseCommand):
    help = (
        "Verify the audit trail's hash chain against the signed checkpoints outside the "
        "database; exit 1 and name the first broken link if any."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify()
        if report.ok:
            self.stdout.write(
                f"audit chain intact: {report.events_checked} events verified, matching "
                f"{report.checkpoints_checked} signed checkpoint(s)"
            )
            return
        self.stderr.write(
            f"audit chain BROKEN at event #{report.first_broken_sequence}: {report.problem} "
            f"({report.events_checked} events verified before it)"
        )
        sys.exit(1)
