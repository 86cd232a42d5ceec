"""A stack on other ports is whole: every address its processes find each other by follows the
ports it was given (issue 24, defect 15: file jobs still called :8080, another stack's gateway
or none), and an address the operator set is theirs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ops.processes import PYTHON, REPO_ROOT
from ops.stack import Stack, StackConfig

# What a child of the stack makes of its environment: the Django settings (web, worker, beat,
# S3 endpoint), the gateway's and the guardrail service's own. Every string setting is listed,
# so that an address added later with a hard-wired default is caught too.
_SETTINGS_OF_A_CHILD = """
import json, django
django.setup()
from django.conf import settings
from gateway.settings import GatewaySettings
from guardrails.service import ServiceSettings

def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)

found = {name: list(strings(getattr(settings, name))) for name in dir(settings) if name.isupper()}
gateway = GatewaySettings.from_env()
found["gateway.control_url"] = [gateway.control_url]
found["gateway.guardrail_url"] = [gateway.guardrails.url]
found["gateway.valkey_url"] = [gateway.fleet.valkey_url]
guard = ServiceSettings.from_env()
found["guardrails.bind"] = [f"http://{guard.host}:{guard.port}"]
tokens = {"gateway": gateway.guardrails.token, "guardrails": guard.token}
print(json.dumps({"settings": found, "tokens": tokens}))
"""

_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):(\d+)")


def _config(tmp_path: Path) -> StackConfig:
    # None of the defaults (8000, 8080, 8095, 9000, 6390, 8101, 8333): nothing is started.
    return StackConfig(
        host="127.0.0.1",
        web_port=18000,
        gateway_port=18080,
        guardrail_port=18095,
        s3_endpoint_port=19000,
        valkey_port=16390,
        fleet_base_port=18101,
        s3_port=18333,
        run_dir=tmp_path / "run",
        sim_time_scale=1.0,
    )


def _settings_of_a_child(stack: Stack) -> dict[str, list[str]]:
    """The settings a child started with the stack's environment reads (a real process), its
    environment built as ManagedProcess builds it: the stack's own over the operator's."""
    result = subprocess.run(
        [PYTHON, "-c", _SETTINGS_OF_A_CHILD],
        cwd=REPO_ROOT,
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout.strip().splitlines()[-1])
    found: dict[str, list[str]] = read["settings"]
    # Not an address, but the one other thing the two must agree on: the service's token.
    tokens = read["tokens"]
    assert tokens["gateway"] == tokens["guardrails"]
    assert len(tokens["gateway"]) >= 32
    return found


@pytest.fixture
def no_operator_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell `make up` runs in sets no SWITCHYARD_* variable of its own."""
    for name in list(os.environ):
        if name.startswith("SWITCHYARD_"):
            monkeypatch.delenv(name)


def test_every_address_a_child_reads_is_on_the_stacks_own_ports(
    tmp_path: Path, no_operator_addresses: None
) -> None:
    config = _config(tmp_path)
    settings = _settings_of_a_child(Stack(config))
    gateway = "http://127.0.0.1:18080"
    web = "http://127.0.0.1:18000"
    assert settings["FILE_JOBS_GATEWAY_URL"] == [gateway]
    assert settings["GATEWAY_PUBLIC_URL"] == [gateway]
    assert settings["PLAYGROUND_GATEWAY_URL"] == [gateway]
    assert settings["S3_ENDPOINT_URL"] == ["http://127.0.0.1:18333"]
    assert settings["S3_ENDPOINT_PUBLIC_URL"] == ["http://127.0.0.1:19000"]
    assert settings["S3_ENDPOINT_CORS_ORIGINS"] == [web]
    assert settings["gateway.control_url"] == [web]
    assert settings["gateway.guardrail_url"] == ["http://127.0.0.1:18095"]
    assert settings["guardrails.bind"] == ["http://127.0.0.1:18095"]
    assert settings["gateway.valkey_url"] == ["valkey://127.0.0.1:16390/0"]
    # Any loopback address anywhere in the settings is one of the stack's own ports.
    own = {18000, 18080, 18095, 19000, 16390, 18333}
    stray = {
        name: value
        for name, values in settings.items()
        for value in values
        for port in _ADDRESS.findall(value)
        if int(port) not in own
    }
    assert stray == {}


def test_an_address_the_operator_set_is_kept_and_the_rest_still_follow_the_ports(
    tmp_path: Path, no_operator_addresses: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a proxy, developers reach the gateway by a name: the portal shows that, while
    file jobs and the playground still call the gateway the stack started."""
    monkeypatch.setenv("SWITCHYARD_GATEWAY_PUBLIC_URL", "https://gateway.example.com")
    monkeypatch.setenv("SWITCHYARD_S3_ENDPOINT_PUBLIC_URL", "https://s3.example.com")
    settings = _settings_of_a_child(Stack(_config(tmp_path)))
    assert settings["GATEWAY_PUBLIC_URL"] == ["https://gateway.example.com"]
    assert settings["S3_ENDPOINT_PUBLIC_URL"] == ["https://s3.example.com"]
    assert settings["FILE_JOBS_GATEWAY_URL"] == ["http://127.0.0.1:18080"]
    assert settings["PLAYGROUND_GATEWAY_URL"] == ["http://127.0.0.1:18080"]
    assert settings["gateway.control_url"] == ["http://127.0.0.1:18000"]
