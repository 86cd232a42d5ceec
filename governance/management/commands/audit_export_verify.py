from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from governance.audit_export import export_verify, signing_public_key


class Command(BaseCommand):
    help = (
        "Check a downloaded audit-trail export offline: its Ed25519 signature, its SHA-256, "
        "every event's hash and link. Exit 1 and say why if anything differs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--public-key",
            help="The signer's public key (base64); by default this deployment's own "
            "(SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.stderr.write(f"cannot read {path}: {exc}")
            sys.exit(2)
        public_key = options["public_key"] or signing_public_key()
        check = export_verify(data, public_key=public_key)
        if not check.ok:
            self.stderr.write(f"audit export NOT verified: {check.problem}")
            sys.exit(1)
        chain = check.summary.get("chain", {})
        self.stdout.write(
            f"audit export verified: {check.events} events "
            f"(#{check.summary.get('first_sequence')}–#{check.summary.get('last_sequence')}), "
            f"signed by {check.public_key}"
        )
        if not check.chain_ok:
            self.stderr.write(
                f"but the chain was BROKEN when it was exported: event "
                f"#{chain.get('first_broken_sequence')}: {chain.get('problem')}"
            )
            sys.exit(1)
        self.stdout.write(
            f"the whole chain was intact when exported ({chain.get('events_checked')} events)"
        )
