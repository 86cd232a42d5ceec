"""Record ids cannot be guessed from one another (issue 24, defect 17).

A record id is returned to the client (``x-switchyard-record-id``), names the request in the
audit trail and appears in the portal's URLs (``/records/<id>/``); it was a per-process tag
plus a counter, so one id gave away every other id that process minted.

GIVEN the gateway's id minting, and a real gateway in front of a simulated model
WHEN ids are minted, directly and by answering requests
THEN each is 32 hex digits (what every store and URL already accepts), all differ, and every
one of the 128 bits varies from id to id: no shared tag, no counter.
"""

from __future__ import annotations

import re
from itertools import pairwise

import httpx
import valkey

from gateway.front_door import minted_id
from testkit.policy import PolicyBuilder
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"
HEX32 = re.compile(r"[0-9a-f]{32}")
# Two random ids share 8 leading hex digits once in 4e9 pairs; tag-and-counter ids share 25+.
SHARED_PREFIX_BOUND = 8


def shared_prefix(a: str, b: str) -> int:
    """How many leading hex digits ``a`` and ``b`` have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_minted_ids_are_128_random_bits() -> None:
    ids = [minted_id() for _ in range(4096)]

    assert all(HEX32.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert max(shared_prefix(a, b) for a, b in pairwise(ids)) < SHARED_PREFIX_BOUND
    # A bit that never changes across 4096 ids is fixed (a tag, a counter's high bits); a
    # random bit stays put with probability 2**-4095.
    values = [int(i, 16) for i in ids]
    always_one = always_zero = (1 << 128) - 1
    for value in values:
        always_one &= value
        always_zero &= ~value
    assert always_one == 0, f"bits always set: {always_one:032x}"
    assert always_zero == 0, f"bits never set: {always_zero:032x}"


def test_record_ids_returned_by_the_gateway_cannot_be_guessed_from_one_another(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    replica = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [replica.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()

    record_ids: list[str] = []
    request_ids: list[str] = []
    with httpx.Client(base_url=gateway.base_url, timeout=10) as client:
        for _ in range(24):
            answer = client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {key}"},
            )
            assert answer.status_code == 200, answer.text
            record_ids.append(answer.headers["x-switchyard-record-id"])
            request_ids.append(answer.headers["x-request-id"])

    for minted in (record_ids, request_ids):
        assert all(HEX32.fullmatch(i) for i in minted), minted
        assert len(set(minted)) == len(minted)
        assert max(shared_prefix(a, b) for a, b in pairwise(minted)) < SHARED_PREFIX_BOUND, minted
    assert not set(record_ids) & set(request_ids)
