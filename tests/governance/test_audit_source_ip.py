"""The audit's source address: X-Forwarded-For is believed only as far as our own proxies
wrote it (SWITCHYARD_TRUSTED_PROXY_HOPS); the client writes the rest."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings

from governance.audit import Actor

FORGED_CHAIN = "6.6.6.6, 203.0.113.9, 10.1.0.2"  # client-written, client, first proxy


def source_ip(forwarded: str | None, remote: str = "10.1.0.3") -> str | None:
    request = RequestFactory().get("/", REMOTE_ADDR=remote)
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    return Actor.from_request(request).source_ip


def test_by_default_no_proxy_is_trusted_and_the_peer_address_is_recorded() -> None:
    assert source_ip(FORGED_CHAIN) == "10.1.0.3"
    assert source_ip(None) == "10.1.0.3"


@pytest.mark.parametrize(
    ("hops", "expected"),
    [(1, "10.1.0.2"), (2, "203.0.113.9")],
)
def test_with_n_trusted_hops_the_nth_address_from_the_right_is_recorded(hops, expected) -> None:
    with override_settings(TRUSTED_PROXY_HOPS=hops):
        assert source_ip(FORGED_CHAIN) == expected


def test_a_chain_shorter_than_the_trusted_hops_falls_back_to_the_peer() -> None:
    # The request did not come through every proxy we expect: its header is the client's.
    with override_settings(TRUSTED_PROXY_HOPS=3):
        assert source_ip("6.6.6.6") == "10.1.0.3"


def test_a_malformed_entry_is_recorded_as_unknown() -> None:
    with override_settings(TRUSTED_PROXY_HOPS=1):
        assert source_ip("203.0.113.9, not-an-ip") is None
