"""Webhooks and async callbacks never reach what only the server can reach (issue 24,
defect 5): loopback (SeaweedFS's filer, Valkey), private and shared networks, link-local
(the cloud metadata service), multicast, unspecified and reserved addresses, in any
spelling. The host is resolved once, every address checked, and the connection made to the
address that was checked, with the URL's own Host; redirects are not followed. An operator
who needs an internal receiver names its network in SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS.

The rule (runtime/outbound_urls.py) is tested over many spellings; then end to end: a use
case's webhook and a task's callback to a loopback receiver are refused where they are
registered (the web API, a real gateway) and where they are sent (a real Celery worker),
and reach the receiver once the allow-list names it.
"""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.choices import FileState
from governance.models import FileRegistration, UseCase
from governance.roles import Role
from governance.webhook_urls import WebhookRefused
from ops.processes import wait_until
from runtime.env import ConfigurationError
from runtime.outbound_urls import (
    HostUnresolved,
    OutboundRefused,
    Resolved,
    SendFailed,
    check_at_registration,
    destination,
    parse_networks,
    post,
    resolve,
)
from scheduler.batcher.callbacks import Callbacks
from scheduler.batcher.payloads import parse_entry
from scheduler.files.webhook_settings import webhook_set
from scheduler.files.webhooks import post_signed, webhook_deliver
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.file_jobs_world import WebhookReceiver, verify_standard_webhook
from tests.conftest import CeleryWorkerFactory
from tests.gateway.test_async_api import (
    EMBED,
    _async_settings,
    async_world,  # noqa: F401 — a fixture
)

ALLOW = "SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS"

FORBIDDEN = [
    "http://127.0.0.1/",
    "http://127.0.0.1:8888/buckets/records/x",  # SeaweedFS's filer on `make up`
    "http://127.0.0.1./",
    "http://localhost:8888/",
    "http://LOCALHOST/",
    "http://localhost./",
    "http://2130706433/",  # 127.0.0.1 as one decimal number
    "http://0x7f000001/",  # … as hex
    "http://0177.0.0.1/",  # … octal
    "http://0x7f.1/",
    "http://127.1/",
    "http://0/",
    "http://0.0.0.0:6390/",
    "http://[::1]/",
    "http://[::]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::127.0.0.1]/",  # IPv4-compatible
    "http://[64:ff9b::7f00:1]/",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of the metadata service
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
    "http://169.254.169.254/latest/meta-data/",
    "http://0xa9fea9fe/",  # 169.254.169.254 as hex
    "http://2852039166/",  # … as decimal
    "http://[fe80::1]/",
    "http://[fe80::1%25eth0]/",
    "http://10.0.0.1/",
    "http://012.0.0.1/",  # 10.0.0.1, octal
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # shared address space (CGNAT)
    "http://[fc00::1]/",
    "http://[fd12:3456::1]/",
    "http://[fec0::1]/",  # site-local
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://192.0.2.1/",  # documentation
    "http://198.18.0.1/",  # benchmarking
    "https://127.0.0.1:443/",
    "http://hooks.example@127.0.0.1:8888/",  # the host is what follows the @
]
MALFORMED = [
    "ftp://example.com/x",
    "file:///etc/passwd",
    "gopher://x",
    "http:///no-host",
    "https://",
    "http://user:pass@hooks.example/",
    "http://hooks.example:99999/",
    "http://hooks.example/a b",
    "http://hooks.example/\r\nX-Injected: 1",
    "http://hooks.example\t/x",
    "http://hōoks.example/",
]


# --- the rule ----------------------------------------------------------------------------
@pytest.mark.parametrize("url", FORBIDDEN)
def test_internal_addresses_are_refused_in_every_spelling(url: str) -> None:
    with pytest.raises(OutboundRefused):
        check_at_registration(url, ())
    with pytest.raises(OutboundRefused):
        resolve(url, ())


@pytest.mark.parametrize("url", MALFORMED)
def test_only_plain_http_urls_with_a_host_are_taken(url: str) -> None:
    with pytest.raises(OutboundRefused):
        destination(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://93.184.215.14/hooks",
        "http://8.8.8.8:8080/x?y=1",
        "https://[2606:4700:4700::1111]/h",
        "https://hooks.example/files",  # not resolvable now: checked again at send time
    ],
)
def test_public_addresses_and_unresolved_names_are_taken_at_registration(url: str) -> None:
    check_at_registration(url, ())


def test_a_name_that_does_not_resolve_is_not_sent_to() -> None:
    with pytest.raises(HostUnresolved):
        resolve("https://hooks.example/files", ())


def test_the_allow_list_opens_only_the_networks_it_names() -> None:
    allowed = parse_networks(["127.0.0.1/32", "::1/128", " 10.1.0.0/16 "])
    assert resolve("http://127.0.0.1:9/x", allowed).address == "127.0.0.1"
    assert resolve("http://2130706433:9/x", allowed).address == "127.0.0.1"
    assert resolve("http://[::1]:9/x", allowed).address == "::1"
    assert resolve("http://10.1.2.3/", allowed).address == "10.1.2.3"
    for still_refused in ("http://127.0.0.2/", "http://10.2.0.1/", "http://169.254.169.254/"):
        with pytest.raises(OutboundRefused):
            resolve(still_refused, allowed)
    # localhost is both 127.0.0.1 and ::1 here: every address must be allowed
    with pytest.raises(OutboundRefused):
        resolve("http://localhost/", parse_networks(["10.0.0.0/8"]))
    for bad in ("localhost", "10.0.0.0/33", "10.0.0.1/8"):
        with pytest.raises(ConfigurationError, match=ALLOW):
            parse_networks([bad])


def test_the_message_says_why_and_what_an_operator_can_do() -> None:
    with pytest.raises(OutboundRefused) as refused:
        check_at_registration("http://0x7f000001:8888/", ())
    assert "loopback" in str(refused.value)
    assert ALLOW in str(refused.value)
    with pytest.raises(OutboundRefused) as named:
        check_at_registration("http://localhost:8888/", ())
    assert "127.0.0.1" not in str(named.value)  # a name's addresses are not told back


# --- the connection: to the address checked, the URL's Host, no redirects ------------------
class Receiver:
    """A real HTTP server on loopback that answers ``status`` and keeps each request."""

    def __init__(
        self, status: int = 200, location: str = "", tls: ssl.SSLContext | None = None
    ) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.requests.append(
                    (self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                self.send_response(status)
                if location:
                    self.send_header("location", location)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_the_request_goes_to_the_checked_address_with_the_urls_own_host(
    receiver: Receiver,
) -> None:
    """GIVEN a destination checked as resolving to 127.0.0.1 WHEN it is posted to THEN the
    connection is made to that address, never by resolving the name again (a rebinding DNS
    answer has no second chance), and the request carries the URL's host and path."""
    named = destination(f"http://hooks.invalid:{receiver.port}/in/box?x=1")
    status = post(
        Resolved(named, "127.0.0.1"), b"{}", {"content-type": "application/json"}, timeout=5
    )
    assert status == 200
    [(path, headers)] = receiver.requests
    assert path == "/in/box?x=1"
    assert headers["host"] == f"hooks.invalid:{receiver.port}"


def _tls_receiver(directory: Path, name: str) -> tuple[Receiver, str]:
    """A TLS receiver on 127.0.0.1 whose (self-signed) certificate names ``name`` only; the
    server and the CA file that trusts it."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert, private = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, private)
    return Receiver(tls=context), str(cert)


def test_https_names_the_urls_host_to_tls_not_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN a TLS receiver whose certificate names hooks.invalid, reached at the checked
    address 127.0.0.1 WHEN posted to as https://hooks.invalid THEN TLS verifies that name
    (SNI and certificate) and the request goes through; as another name, it is refused."""
    receiver, ca_file = _tls_receiver(tmp_path, "hooks.invalid")
    monkeypatch.setenv("SSL_CERT_FILE", ca_file)
    try:
        named = destination(f"https://hooks.invalid:{receiver.port}/h")
        assert post(Resolved(named, "127.0.0.1"), b"{}", {}, timeout=5) == 200
        other = destination(f"https://other.invalid:{receiver.port}/h")
        with pytest.raises(SendFailed, match="SSLCertVerificationError"):
            post(Resolved(other, "127.0.0.1"), b"{}", {}, timeout=5)
    finally:
        receiver.close()
    [(_, headers)] = receiver.requests
    assert headers["host"] == f"hooks.invalid:{receiver.port}"


def test_a_redirect_is_answered_not_followed() -> None:
    """GIVEN a receiver that redirects to the metadata service WHEN a webhook is sent THEN the
    redirect is the answer (retried later), and nothing is asked of the place it names."""
    redirecting = Receiver(302, "http://169.254.169.254/latest/meta-data/")
    try:
        target = resolve(f"http://127.0.0.1:{redirecting.port}/h", parse_networks(["127.0.0.1/32"]))
        assert post(target, b"{}", {}, timeout=5) == 302
        assert len(redirecting.requests) == 1
    finally:
        redirecting.close()


# --- end to end: registration and sending ------------------------------------------------
@pytest.fixture
def use_case() -> UseCase:
    llama = make_model("llama", capabilities=["chat"])
    return make_use_case(make_tenant("acme"), "docs", models=(llama,))


def _ended(use_case: UseCase) -> FileRegistration:
    return FileRegistration.objects.create(
        use_case=use_case,
        registered_by="tests",
        kind="text",
        filename="notes.txt",
        model=use_case.allowed_models.get(),
        declared_bytes=10,
        state=FileState.DONE,
        estimated_tokens=10,
        promised_by=datetime.now(UTC) + timedelta(hours=1),
    )


@pytest.mark.django_db
def test_a_webhook_to_loopback_is_refused_when_set_unless_the_operator_allows_it(
    use_case: UseCase, settings: Any
) -> None:
    """GIVEN alice, a developer of acme, and a receiver on loopback WHEN she sets it as the
    use case's webhook through the API THEN 400 naming webhook_url, nothing stored; the same
    with the address spelled in hex; once the operator allows 127.0.0.1/32, it is taken."""
    alice = make_user("alice", Role.DEVELOPER, tenants=(use_case.tenant,))
    client = APIClient()
    client.force_authenticate(alice)
    path = f"/api/use-cases/{use_case.pk}/webhook/"
    with WebhookReceiver() as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        for url in (receiver.url, f"http://0x7f000001:{port}/hooks", f"http://localhost:{port}/"):
            refused = client.post(path, {"url": url}, format="json")
            assert refused.status_code == 400, refused.content
            assert "loopback" in str(refused.json()["webhook_url"]), refused.json()
        use_case.refresh_from_db()
        assert (use_case.webhook_url, use_case.webhook_secret_sealed) == ("", "")

        settings.WEBHOOK_ALLOWED_NETWORKS = parse_networks(["127.0.0.1/32"])
        taken = client.post(path, {"url": receiver.url}, format="json")
        assert taken.status_code == 200, taken.content
        assert webhook_deliver(_ended(use_case).pk, "file.done", "msg_1_done") == "delivered"
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_a_webhook_stored_before_is_checked_again_when_sent(
    use_case: UseCase, settings: Any
) -> None:
    """GIVEN a use case whose webhook was set to a loopback receiver while the operator
    allowed it WHEN the allow-list no longer names it (or the name now resolves there) THEN
    the delivery is refused, not retried, and the receiver hears nothing."""
    with WebhookReceiver() as receiver:
        settings.WEBHOOK_ALLOWED_NETWORKS = parse_networks(["127.0.0.1/32"])
        assert webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        settings.WEBHOOK_ALLOWED_NETWORKS = ()
        assert webhook_deliver(_ended(use_case).pk, "file.done", "msg_2_done") == "refused"
        use_case.refresh_from_db()
        with pytest.raises(WebhookRefused):
            post_signed(receiver.url, use_case.webhook_secret_sealed, "m", 1, b"{}")
    assert receiver.received == []


def test_a_callback_to_loopback_is_refused_at_submit_unless_the_gateway_allows_it(
    async_world: Any,  # noqa: F811
) -> None:
    """GIVEN alice's use case signs its callbacks WHEN she submits a task whose callback_url
    is a loopback receiver, in any spelling, alone or in a bulk THEN 400 naming callback_url
    (and the body), nothing queued; a gateway whose operator allows 127.0.0.1/32 takes it."""
    _async_settings(async_world.policy, async_world.alice, signed_callbacks=True)
    world = async_world.start()
    good = {"model": EMBED, "input": "x"}
    for url in (
        "http://127.0.0.1:8888/buckets/x",
        "http://2130706433:8888/",
        "http://localhost:8888/",
        "http://[::ffff:127.0.0.1]:8888/",
        "http://169.254.169.254/latest/meta-data/",
    ):
        response = world.post(world.alice, "/v1/async/embeddings", {**good, "callback_url": url})
        assert response.status_code == 400, (url, response.text)
        error = response.json()["error"]
        assert error["param"] == "callback_url", error
        assert error["code"] == "callback_url_refused", error
    bulk = world.post(
        world.alice,
        "/v1/async/embeddings",
        [good, {**good, "callback_url": "http://0x7f000001:8888/"}],
    )
    assert bulk.status_code == 400, bulk.text
    assert bulk.json()["error"]["param"] == "[1].callback_url"
    assert world.nothing_queued()

    allowing = async_world.start(**{ALLOW: "127.0.0.1/32"})
    taken = allowing.post(
        allowing.alice, "/v1/async/embeddings", {**good, "callback_url": "http://127.0.0.1:9/x"}
    )
    assert taken.status_code == 202, taken.text


def _send_callback(valkey_url: str, use_case_id: int, url: str, task_id: str) -> None:
    """What the batcher does when a task ends (scheduler/batcher/callbacks.py)."""
    task = parse_entry(
        "stream",
        "1-0",
        {
            "task": task_id,
            "endpoint": "/v1/embeddings",
            "model": "embed",
            "use_case_id": str(use_case_id),
            "callback_url": url,
            "body": '{"input": "x"}',
        },
    )

    async def send() -> None:
        Callbacks(valkey_url).send(task, {"status": "done", "status_code": 200})

    asyncio.run(send())  # the run waits for the executor that enqueues it


@pytest.mark.django_db(transaction=True)
def test_a_callback_is_checked_again_by_the_worker_that_sends_it(
    use_case: UseCase,
    settings: Any,
    valkey_url: str,
    start_celery_worker: CeleryWorkerFactory,
) -> None:
    """GIVEN a task that ended with a loopback callback_url (queued before the rule, or its
    name now resolving there) WHEN a worker without an allow-list sends it THEN it is refused
    and the receiver hears nothing; a worker whose operator allows 127.0.0.1/32 delivers it."""
    with WebhookReceiver() as receiver:
        settings.WEBHOOK_ALLOWED_NETWORKS = parse_networks(["127.0.0.1/32"])
        secret = webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        assert secret is not None

        strict = start_celery_worker("strict")
        _send_callback(valkey_url, use_case.pk, receiver.url + "/t1", "task_strict")
        assert wait_until(lambda: "'refused'" in strict.log_text(), timeout=60), strict.log_tail()
        strict.stop()
        assert receiver.received == []

        allowing = start_celery_worker("allowing", **{ALLOW: "127.0.0.1/32"})
        _send_callback(valkey_url, use_case.pk, receiver.url + "/t2", "task_allowed")
        assert wait_until(lambda: len(receiver.received) == 1, timeout=60), allowing.log_tail()
    [(headers, body)] = receiver.received
    assert verify_standard_webhook(secret, headers, body)
    assert headers["webhook-id"] == "msg_task_allowed_done"
