"""Governance accepts a headless Service's name as a deployment's replica (dns+http(s)://),
in the admin and API (Deployment.clean) and in policy as code, and still refuses the rest."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from governance.models import Deployment
from governance.policy_as_code.fields import check_replica_url

SERVICE = "dns+http://vllm-llama.inference.svc.cluster.local:8000"


@pytest.mark.parametrize("replica", [SERVICE, "dns+https://vllm-llama", "http://10.0.0.1:8000"])
def test_a_base_url_or_a_service_name_is_a_replica(replica: str) -> None:
    Deployment(served_name="llama", replicas=[replica]).clean()
    assert check_replica_url(replica) is None


@pytest.mark.parametrize("replica", ["dns+ftp://vllm:8000", "dns+http://", "vllm:8000"])
def test_anything_else_is_refused_in_both_places(replica: str) -> None:
    assert check_replica_url(replica) is not None
    with pytest.raises(ValidationError, match="service name"):
        Deployment(served_name="llama", replicas=[replica]).clean()
