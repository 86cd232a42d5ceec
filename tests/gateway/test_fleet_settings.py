"""The gateways, the batchers and the fleet watcher agree on the fleet by construction: each
process's settings, parsed from one environment, carry the same FleetSettings, and a shared
variable reaches all three through it, and through nothing else in any of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import pytest

from gateway.fleet_settings import FleetSettings
from gateway.fleet_watcher import WatcherSettings
from gateway.settings import GatewaySettings
from runtime.env import ConfigurationError
from scheduler.batcher.settings import BatcherSettings

# Each process's own parse, as it runs at start-up (runtime/service.py's run_service).
PROCESSES: dict[str, Callable[[], Any]] = {
    "gateway": GatewaySettings.from_env,
    "batcher": BatcherSettings.from_env,
    "fleet watcher": WatcherSettings.from_env,
}

# What an unset environment means, as the README lists it.
DEFAULTS = FleetSettings(
    valkey_url="valkey://127.0.0.1:6390/0",
    policy_refresh_s=1.0,
    policy_max_staleness_s=60.0,
    upstream_connect_timeout_s=2.0,
    lease_s=30.0,
    heartbeat_s=5.0,
    fleet_stale_s=0.9,
    backpressure_waiting=3,
    long_prompt_tokens=8192,
)

# Every shared variable: a value other than its default (the lowest one accepted, where there
# is a lower bound, so that the bound is the same everywhere too), the field it sets and
# what the field then holds, and a value just below the bound that every process refuses.
CHANGES: list[tuple[str, str, str, Any]] = [
    ("SWITCHYARD_VALKEY_URL", "redis://10.1.2.3:6379/4", "valkey_url", "valkey://10.1.2.3:6379/4"),
    ("SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS", "0.05", "policy_refresh_s", 0.05),
    ("SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS", "1", "policy_max_staleness_s", 1.0),
    (
        "SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
        "0.01",
        "upstream_connect_timeout_s",
        0.01,
    ),
    ("SWITCHYARD_GATEWAY_LEASE_SECONDS", "1", "lease_s", 1.0),
    ("SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS", "2", "heartbeat_s", 2.0),
    ("SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS", "0.05", "fleet_stale_s", 0.05),
    ("SWITCHYARD_GATEWAY_BACKPRESSURE_WAITING", "1", "backpressure_waiting", 1),
    ("SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS", "0", "long_prompt_tokens", 0),
]
REFUSED = [
    ("SWITCHYARD_VALKEY_URL", "http://10.1.2.3:6379/4"),
    ("SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS", "0.04"),
    ("SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS", "0.9"),
    ("SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS", "0.009"),
    ("SWITCHYARD_GATEWAY_LEASE_SECONDS", "0.9"),
    ("SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS", "1.9"),
    ("SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS", "0.04"),
    ("SWITCHYARD_GATEWAY_BACKPRESSURE_WAITING", "0"),
    ("SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS", "-1"),
]


@pytest.fixture
def shared_unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """None of the shared variables set, by value or by file."""
    for variable, *_ in CHANGES:
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(f"{variable}_FILE", raising=False)
    return monkeypatch


def parse_all() -> dict[str, Any]:
    return {name: parse() for name, parse in PROCESSES.items()}


def test_the_tables_here_cover_every_shared_value() -> None:
    """A value added to FleetSettings must be added here, or this file proves nothing of it."""
    shared = {f.name for f in fields(FleetSettings)}
    assert {field for _, _, field, _ in CHANGES} == shared
    assert [variable for variable, *_ in CHANGES] == [variable for variable, _ in REFUSED]


def test_an_unset_environment_gives_every_process_the_documented_defaults(
    shared_unset: pytest.MonkeyPatch,
) -> None:
    """GIVEN none of the shared variables set, WHEN the gateway, the batcher and the fleet
    watcher parse their settings, THEN each holds the documented defaults."""
    assert FleetSettings.from_env() == DEFAULTS
    for name, settings in parse_all().items():
        assert settings.fleet == DEFAULTS, f"the {name}'s defaults differ"


def test_one_environment_gives_the_three_processes_one_fleet(
    shared_unset: pytest.MonkeyPatch,
) -> None:
    """GIVEN every shared variable changed at once, WHEN the three processes parse their
    settings, THEN they hold equal FleetSettings, with every change in it."""
    for variable, value, _, _ in CHANGES:
        shared_unset.setenv(variable, value)
    expected = replace(DEFAULTS, **{field: parsed for _, _, field, parsed in CHANGES})
    assert FleetSettings.from_env() == expected
    for name, settings in parse_all().items():
        assert settings.fleet == expected, f"the {name} disagrees"


@pytest.mark.parametrize(
    ("variable", "value", "field", "parsed"), CHANGES, ids=[c[0] for c in CHANGES]
)
def test_a_changed_variable_reaches_all_three_through_the_fleet_only(
    shared_unset: pytest.MonkeyPatch, variable: str, value: str, field: str, parsed: Any
) -> None:
    """GIVEN the three processes' settings from one environment, WHEN one shared variable
    changes, THEN each one's fleet settings carry the new value, and nothing else in any of
    them moved: a process that read the variable itself, into a setting of its own under
    whatever name, would show here."""
    before = parse_all()
    shared_unset.setenv(variable, value)
    after = parse_all()
    for name in PROCESSES:
        assert after[name].fleet == replace(DEFAULTS, **{field: parsed}), (
            f"{variable} did not reach the {name}'s fleet settings as {parsed!r}"
        )
        assert replace(after[name], fleet=before[name].fleet) == before[name], (
            f"the {name} also reads {variable} into a setting of its own"
        )


@pytest.mark.parametrize(("variable", "value"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_value_out_of_bounds_stops_all_three_at_start(
    shared_unset: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """GIVEN a shared variable just below its lowest accepted value (or a Valkey URL of a
    scheme no client speaks), WHEN the processes parse their settings, THEN every one of
    them refuses to start, naming the variable."""
    shared_unset.setenv(variable, value)
    for parse in PROCESSES.values():
        with pytest.raises(ConfigurationError, match=variable):
            parse()


def test_the_gateway_and_the_batcher_capture_records_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a full record keeps is read once, into one RecordCaptureSettings, by both."""
    assert GatewaySettings.from_env().records == BatcherSettings.from_env().records
    monkeypatch.setenv("SWITCHYARD_RECORD_MAX_CONTENT_BYTES", "4096")
    monkeypatch.setenv("SWITCHYARD_RECORD_BUFFER_BYTES", "65536")
    gateway, batcher = GatewaySettings.from_env().records, BatcherSettings.from_env().records
    assert gateway == batcher
    assert (gateway.max_content_bytes, gateway.buffer_bytes) == (4096, 65536)
