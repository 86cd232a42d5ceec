from __future__ import annotations

import argparse
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from ops.demo import demo_seed, parse_fleet_arg


class Command(BaseCommand):
    help = "Create or refresh the embedded demo (tenant, use case, fleet) and mint a demo key."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--model",
            action="append",
            default=[],
            metavar="NAME=CAPS=URL[,URL]",
            help="A model of the demo fleet, e.g. llama=chat+completions=http://127.0.0.1:8101",
        )
        parser.add_argument("--admin-password", default="switchyard-demo")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.PRODUCTION:
            raise CommandError("seed_demo is for the embedded demo only (SWITCHYARD_MODE=embedded)")
        try:
            fleet = [parse_fleet_arg(value) for value in options["model"]]
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not fleet:
            raise CommandError("give at least one --model")
        try:
            seed = demo_seed(fleet=fleet, admin_password=options["admin_password"])
        except ValidationError as exc:
            raise CommandError(f"invalid demo fleet: {'; '.join(exc.messages)}") from exc
        if options["json"]:
            self.stdout.write(
                orjson.dumps(
                    {
                        "api_key": seed.key_plaintext,
                        "admin_username": seed.admin_username,
                        "admin_password": seed.admin_password,
                        "s3_access_key_id": seed.s3_access_key_id,
                        "s3_secret": seed.s3_secret,
                    }
                ).decode()
            )
        else:
            self.stdout.write(f"demo API key: {seed.key_plaintext}")
