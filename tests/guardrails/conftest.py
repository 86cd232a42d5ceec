from tests.support.guardrail_service import start_guardrail_service

__all__ = ["start_guardrail_service"]
