from __future__ import annotations

import pytest

from runtime.env import (
    ConfigurationError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
)
from runtime.valkey_urls import for_kombu, for_valkey_py


def test_values_come_from_the_environment_with_defaults(monkeypatch) -> None:
    monkeypatch.setenv("SY_INT", "42")
    monkeypatch.setenv("SY_LIST", "a, b,,c")
    assert env_int("SY_INT", 1) == 42
    assert env_int("SY_MISSING", 7) == 7
    assert env_list("SY_LIST", []) == ["a", "b", "c"]
    assert env_str("SY_MISSING", "d") == "d"


@pytest.mark.parametrize(
    ("call", "value", "message"),
    [
        (lambda: env_int("SY_X", 1), "ten", "not an integer"),
        (lambda: env_int("SY_X", 1, minimum=5), "2", "at least 5"),
        (lambda: env_float("SY_X", 1.0), "fast", "not a number"),
        (lambda: env_bool("SY_X", False), "maybe", "not a boolean"),
        (lambda: env_choice("SY_X", "a", ("a", "b")), "c", "must be one of a, b"),
    ],
)
def test_a_bad_value_fails_loudly_naming_the_variable(monkeypatch, call, value, message) -> None:
    monkeypatch.setenv("SY_X", value)
    with pytest.raises(ConfigurationError, match=message) as caught:
        call()
    assert "SY_X" in str(caught.value)


def test_secrets_can_come_from_a_file(monkeypatch, tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    monkeypatch.setenv("SY_SECRET_FILE", str(secret))
    assert env_str("SY_SECRET", "default") == "s3cr3t"
    monkeypatch.setenv("SY_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="SY_SECRET_FILE"):
        env_str("SY_SECRET", "default")


@pytest.mark.parametrize(
    ("given", "kombu", "valkey_py"),
    [
        ("valkey://h:1/0", "redis://h:1/0", "valkey://h:1/0"),
        ("valkeys://:pw@h:1/2", "rediss://:pw@h:1/2", "valkeys://:pw@h:1/2"),
        ("redis://h:1/0", "redis://h:1/0", "valkey://h:1/0"),
        ("unix:///run/v.sock?db=1", "redis+socket:///run/v.sock?db=1", "unix:///run/v.sock?db=1"),
    ],
)
def test_one_valkey_url_is_spelled_for_each_client(given, kombu, valkey_py) -> None:
    assert for_kombu(given) == kombu
    assert for_valkey_py(given) == valkey_py


def test_an_unknown_valkey_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="valkey://"):
        for_kombu("http://h:1")


def test_production_mode_refuses_to_start_without_a_secret_key() -> None:
    import subprocess
    import sys

    from ops.processes import REPO_ROOT

    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; from django.conf import settings; settings.SECRET_KEY",
        ],
        cwd=REPO_ROOT,
        env={
            "SWITCHYARD_MODE": "production",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PATH": "/usr/bin",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "SWITCHYARD_SECRET_KEY must be set" in result.stderr
