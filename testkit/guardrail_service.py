"""Start the real guardrail service (``python -m guardrails.service``) for a test, with the
test detectors registered through SWITCHYARD_GUARDRAIL_DETECTORS."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from testkit.guardrail_detectors import SERVICE_ENV
from testkit.stack import RunningGuardrailService, running_stack

GuardrailServiceFactory = Callable[..., RunningGuardrailService]


@pytest.fixture
def start_guardrail_service() -> Iterator[GuardrailServiceFactory]:
    with running_stack() as stack:

        def start(**env: str) -> RunningGuardrailService:
            return stack.guardrail_service({**SERVICE_ENV, **env})

        yield start
