"""The gateway's control proxy forwards only the Files and Batches routes to the web process,
whatever the spelling of the path (issue 24, defect 4).

GIVEN a real gateway whose ``SWITCHYARD_CONTROL_URL`` is a real web process (uvicorn serving
config.asgi, with Django's admin at ``/admin/``)
WHEN a client sends a path under ``/v1/files`` or ``/v1/batches`` that walks out of them (dot
segments, raw or percent-encoded; encoded slashes and backslashes; empty segments) or that
names no route of theirs
THEN the gateway answers it in OpenAI's error shape (400 ``invalid_path``, 404 ``not_found``)
and the web process never sees it: without the fix the admin answered its login redirect.

Requests go out through http.client with the target exactly as written: httpx, like a browser,
would resolve the dot segments before sending them.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import valkey

from testkit.database import database_url
from testkit.policy import PolicyBuilder
from testkit.web_process import running_web
from tests.conftest import GatewayFactory

pytestmark = pytest.mark.django_db(transaction=True)

# Each would reach the web's /admin/ (or /api/) if forwarded as the web server reads it.
WALKS_OUT = [
    "/v1/files/../../admin/",
    "/v1/batches/../../admin/",
    "/v1/files/./../../admin/",
    "/v1/files/..%2F..%2Fadmin/",
    "/v1/files/..%2f..%2fadmin/",
    "/v1/files%2F..%2F..%2Fadmin/",
    "/v1/files/%2e%2e/%2e%2e/admin/",
    "/v1/files/%2E%2E/%2E%2E/api/",
    "/v1/files/%252e%252e/%252e%252e/admin/",
    "/v1/fil%65s/../../admin/",
    "/v1/files/..\\..\\admin/",
    "/v1/files/..%5c..%5cadmin/",
    "/v1/files//..//..//admin/",
    "/v1/files/file-1/..",
]
# Clean paths under the two prefixes that are not routes of the Files and Batches APIs.
NOT_ROUTES = [
    "/v1/files/",
    "/v1/files/file-1/content/extra",
    "/v1/files/file-1/other",
    "/v1/batches/batch_1/delete",
    "/v1/files/..;/..;/admin/",
]


def raw_get(base_url: str, target: str) -> tuple[int, dict[str, str], bytes]:
    """GET ``target`` byte for byte as written: no normalisation on the way out."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.request("GET", target)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def gateway_error(body: bytes) -> dict[str, Any]:
    document = orjson.loads(body)
    error: dict[str, Any] = document["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.fixture
def gateway(
    tmp_path: Path, valkey_url: str, valkey_client: valkey.Valkey, start_gateway: GatewayFactory
) -> Iterator[str]:
    PolicyBuilder().publish(valkey_client)
    env = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_DATABASE_URL": database_url(),
        "SWITCHYARD_RUN_DIR": str(tmp_path),
    }
    with running_web(env) as web_url:
        # The web's admin is there to be reached: its login redirect is what a leak looks like.
        status, headers, _ = raw_get(web_url, "/admin/")
        assert status == 302
        assert "/admin/login/" in headers["location"]
        yield start_gateway(SWITCHYARD_CONTROL_URL=web_url).base_url


def test_the_files_and_batches_routes_still_reach_the_web_process(gateway: str) -> None:
    # No key: the web process's own authentication answers, so the request went through.
    for target in (
        "/v1/files",
        "/v1/files?purpose=batch",
        "/v1/files/file-abc123",
        "/v1/files/file-abc123/content",
        "/v1/batches",
        "/v1/batches/batch_1",
        "/v1/batches/batch_1/cancel",
    ):
        status, _, body = raw_get(gateway, target)
        assert status == 401, (target, status, body)
        assert gateway_error(body)["code"] != "invalid_path"


def test_a_path_that_walks_out_of_files_and_batches_is_refused(
    gateway: str, subtests: pytest.Subtests
) -> None:
    for target in WALKS_OUT:
        with subtests.test(target=target):
            status, headers, body = raw_get(gateway, target)
            assert status == 400, (status, headers.get("location"), body[:200])
            error = gateway_error(body)
            assert error["code"] == "invalid_path"
            assert error["type"] == "invalid_request_error"


def test_a_path_that_is_no_route_of_files_and_batches_is_not_forwarded(
    gateway: str, subtests: pytest.Subtests
) -> None:
    for target in NOT_ROUTES:
        with subtests.test(target=target):
            status, _, body = raw_get(gateway, target)
            assert status == 404, (status, body[:200])
            error = gateway_error(body)
            assert error["code"] == "not_found"
            assert error["message"].startswith("Unknown path")
