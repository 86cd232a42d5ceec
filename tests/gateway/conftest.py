from __future__ import annotations

from dataclasses import dataclass

import pytest

from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-test"
EMBED = "embed-test"


@dataclass
class World:
    """One gateway in front of a two-replica chat model and an embedding model.

    alice's key may call both models; bob's key (another tenant) only the chat model.
    """

    gateway: RunningGateway
    policy: PolicyBuilder
    alice: str
    bob: str
    chat_replicas: list[str]


@pytest.fixture
def world(valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory) -> World:
    chat = [start_simulator(CHAT, "--time-scale", "0.01") for _ in range(2)]
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0.01")
    policy = PolicyBuilder()
    policy.model(CHAT, [s.base_url for s in chat])
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))
    alice = policy.key(tenant="acme", use_case="assistant")
    bob = policy.key(tenant="globex", use_case="summariser", models=[CHAT])
    policy.publish(valkey_client)
    return World(start_gateway(), policy, alice, bob, [s.base_url for s in chat])


# The guardrail service, for tests/gateway/test_guardrails*.py.
from testkit.guardrail_service import start_guardrail_service  # noqa: E402

__all__ = ["World", "start_guardrail_service", "world"]
