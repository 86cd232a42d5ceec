"""``manage.py policy validate|plan|apply|export``: governance records as a YAML file in git."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from governance.audit import Actor
from governance.policy_as_code.apply import ApplyResult, policy_apply
from governance.policy_as_code.errors import PolicyApplyFailed, PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.render import plan_json, plan_text, problems_text
from governance.policy_as_code.schema import PolicyDocument, policy_load
from governance.policy_as_code.selectors import policy_current

EXIT_CHANGES = 2  # like `terraform plan -detailed-exitcode`: CI can gate on a pending change
SYSTEM_ACTOR = Actor.system("policy-as-code")


class Command(BaseCommand):
    help = "Validate, plan, apply or export the governance policy as a YAML file."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

        validate = commands.add_parser("validate", help="Check a policy file on its own.")
        validate.add_argument("file", help="the policy file, or - for standard input")

        plan = commands.add_parser(
            "plan", help="Show what apply would change; exit 0 if nothing, 2 if something."
        )
        plan.add_argument("file", help="the policy file, or - for standard input")
        self._apply_options(plan)
        plan.add_argument("--json", action="store_true", help="print the plan as JSON")

        apply = commands.add_parser("apply", help="Make the database match the file.")
        apply.add_argument("file", help="the policy file, or - for standard input")
        self._apply_options(apply)
        apply.add_argument(
            "--actor",
            default="",
            help="who applies, for the audit trail (default: system:policy-as-code)",
        )
        apply.add_argument("--json", action="store_true", help="print the result as JSON")

        export = commands.add_parser("export", help="Write the database as a policy file.")
        export.add_argument("file", nargs="?", default="-", help="where to write (default: -)")

    @staticmethod
    def _apply_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete records the file does not list (use cases are retired)",
        )
        parser.add_argument(
            "--mint-keys",
            action="store_true",
            help="mint the keys: entries that have no active key, printing each secret once",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        command = options["command"]
        if command == "export":
            self._export(options["file"])
            return
        document = self._load(options["file"])
        if command == "validate":
            self.stdout.write(f"{options['file']}: valid")
        elif command == "plan":
            self._plan(document, options)
        else:
            self._apply(document, options)

    def _load(self, name: str) -> PolicyDocument:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {name}: {exc.strerror}") from exc
        try:
            return policy_load(text)
        except PolicyInvalid as exc:
            raise self._refusal(name, exc, "is not a valid policy") from exc

    def _refusal(self, name: str, exc: PolicyInvalid, what: str) -> CommandError:
        self.stderr.write(f"{name} {what}:\n{problems_text(exc.problems)}", ending="")
        count = len(exc.problems)
        return CommandError(f"{count} problem{'s' if count != 1 else ''} in {name}")

    def _plan(self, document: PolicyDocument, options: dict[str, Any]) -> None:
        try:
            plan = plan_build(
                document,
                policy_current(),
                prune=options["prune"],
                mint_keys=options["mint_keys"],
            )
        except PolicyInvalid as exc:
            raise self._refusal(options["file"], exc, "cannot be applied") from exc
        if options["json"]:
            self.stdout.write(orjson.dumps(plan_json(plan), option=orjson.OPT_INDENT_2).decode())
        else:
            self.stdout.write(plan_text(plan), ending="")
        if plan.has_changes:
            raise SystemExit(EXIT_CHANGES)

    def _apply(self, document: PolicyDocument, options: dict[str, Any]) -> None:
        # An operator's command runs as the platform, named after whoever ran it.
        actor = (
            Actor(username=options["actor"], is_system=True) if options["actor"] else SYSTEM_ACTOR
        )
        try:
            result = policy_apply(
                document=document,
                actor=actor,
                prune=options["prune"],
                mint_keys=options["mint_keys"],
            )
        except PolicyApplyFailed as exc:
            raise self._refusal(options["file"], exc, "was not applied (nothing changed)") from exc
        except PolicyInvalid as exc:
            raise self._refusal(options["file"], exc, "cannot be applied") from exc
        if options["json"]:
            self._apply_json(result)
            return
        self.stdout.write(plan_text(result.plan), ending="")
        if result.plan.has_changes:
            self.stdout.write(f"Applied {len(result.plan.changes)} change(s) as {actor.username}.")
        if result.minted:
            self.stdout.write(
                "\nNew keys. Each secret is shown this once and never again: store it now."
            )
            for key in result.minted:
                self.stdout.write(f"  {key.use_case}  {key.name}: {key.plaintext}")

    def _apply_json(self, result: ApplyResult) -> None:
        document = {
            **plan_json(result.plan),
            "minted_keys": [
                {"use_case": k.use_case, "name": k.name, "prefix": k.prefix, "key": k.plaintext}
                for k in result.minted
            ],
        }
        self.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())

    def _export(self, name: str) -> None:
        try:
            text = policy_export()
        except PolicyInvalid as exc:
            raise self._refusal("the database", exc, "cannot be exported") from exc
        if name == "-":
            self.stdout.write(text, ending="")
            return
        try:
            Path(name).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {name}: {exc.strerror}") from exc
        self.stderr.write(f"exported the policy to {name}")
