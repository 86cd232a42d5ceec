"""The gateway's service-account token verifier, in process, against a real JWKS endpoint.

The endpoint is a small aiohttp server on loopback that counts its requests, so the tests
can say exactly how often the key set was fetched; signature checks are counted by the
verifier itself. Nothing is timed: the cache is proved by counts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.service_accounts import (
    KeysUnavailable,
    TokenRefused,
    TokenVerifier,
    VerifiedToken,
    signing_keys,
)
from gateway.settings import ServiceAccountSettings
from ops.processes import free_port

ISSUER = "http://127.0.0.1:9/realms/switchyard"
CLIENT = "batch-worker"


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 20))


def public_jwk(key: rsa.RSAPrivateKey, kid: str, **extra: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "alg": "RS256", "use": "sig", **extra}


@dataclass
class Realm:
    """A realm's signing keys, published at a real JWKS endpoint that counts its fetches."""

    keys: dict[str, rsa.RSAPrivateKey] = field(default_factory=dict)
    published: set[str] = field(default_factory=set)
    fetches: int = 0
    down: bool = False
    port: int = field(default_factory=free_port)

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/certs"

    def add_key(self, kid: str, *, publish: bool = True) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if publish:
            self.published.add(kid)

    def token(self, kid: str = "k1", **changes: Any) -> bytes:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": "switchyard-api",
            "azp": CLIENT,
            "preferred_username": f"service-account-{CLIENT}",
            "iat": now,
            "exp": now + 300,
            **changes,
        }
        claims = {name: value for name, value in claims.items() if value is not None}
        return jwt.encode(claims, self.keys[kid], algorithm="RS256", headers={"kid": kid}).encode()

    async def certs(self, request: web.Request) -> web.Response:
        self.fetches += 1
        if self.down:
            return web.Response(status=503, text="down for maintenance")
        document = {"keys": [public_jwk(self.keys[kid], kid) for kid in sorted(self.published)]}
        return web.json_response(document)


Scenario = Callable[[Realm, TokenVerifier], Awaitable[None]]


async def with_verifier(scenario: Scenario, **options: Any) -> None:
    """A realm with key k1 published, and a started verifier that has fetched it."""
    realm = Realm()
    realm.add_key("k1")
    app = web.Application()
    app.router.add_get("/certs", realm.certs)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", realm.port).start()
    settings = ServiceAccountSettings(
        issuer=ISSUER,
        jwks_url=realm.jwks_url,
        audience=options.pop("audience", "switchyard-api"),
        clients=frozenset(options.pop("clients", ())),
        leeway_s=options.pop("leeway_s", 0),
        verify_ssl=True,
        timeout_s=5.0,
    )
    verifier = TokenVerifier(settings, **options)
    await verifier.start()
    try:
        await fetched(realm, verifier)
        await scenario(realm, verifier)
    finally:
        await verifier.close()
        await runner.cleanup()


async def fetched(realm: Realm, verifier: TokenVerifier) -> None:
    """Wait for the start-up fetch, which runs in the background: until then a token's kid
    is unknown (None); after it, the token is judged (verified, or refused on its claims)."""
    probe = realm.token(jti="start-up probe")
    for _ in range(500):
        try:
            if verifier.verify(probe) is not None:
                return
        except TokenRefused:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the verifier never fetched the key set")


def test_a_verified_token_is_remembered_so_the_next_request_checks_no_signature() -> None:
    """GIVEN a verifier that has checked a token once
    WHEN the same token comes again (and again)
    THEN no signature is checked again; a different token is checked once."""

    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        token = realm.token(jti="one")
        before = verifier.verifications
        first = verifier.verify(token)
        assert first == VerifiedToken(client_id=CLIENT, valid_until=first.valid_until)
        assert verifier.verifications == before + 1
        for _ in range(100):
            assert verifier.verify(token) == first
        assert verifier.verifications == before + 1
        verifier.verify(realm.token(jti="two"))
        assert verifier.verifications == before + 2
        assert realm.fetches == 1  # and the key set was fetched once, at start-up

    run(with_verifier(scenario))


def test_a_remembered_token_stops_working_when_it_expires() -> None:
    now = [time.time()]

    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        token = realm.token(exp=int(now[0]) + 60)
        assert verifier.verify(token) is not None
        checked = verifier.verifications
        now[0] += 59
        assert verifier.verify(token) is not None
        now[0] += 2  # past exp: refused from memory, no signature checked
        with pytest.raises(TokenRefused, match="has expired"):
            verifier.verify(token)
        assert verifier.verifications == checked

    run(with_verifier(scenario, clock=lambda: now[0]))


def test_the_cache_is_bounded() -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        tokens = [realm.token(jti=str(n)) for n in range(50)]
        for token in tokens:
            verifier.verify(token)
        assert 0 < verifier.cached <= 10
        # The newest is still remembered; the oldest was forgotten and is checked again.
        checked = verifier.verifications
        verifier.verify(tokens[-1])
        assert verifier.verifications == checked
        verifier.verify(tokens[0])
        assert verifier.verifications == checked + 1

    run(with_verifier(scenario, cache_size=10))


def test_a_new_key_is_fetched_once_when_a_token_names_it_then_not_again_within_the_cooldown() -> (
    None
):
    """GIVEN the realm publishes a new key k2 after the verifier fetched its key set
    WHEN a token signed with k2 arrives
    THEN its request awaits one refetch and is verified; a token naming a kid the realm does
    not publish is refused from memory during the cooldown, without another fetch."""

    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        realm.add_key("k2")
        rotated = realm.token("k2")
        assert verifier.verify(rotated) is None  # not known yet: the caller must await
        verified = await verifier.verify_after_fetch(rotated)
        assert verified.client_id == CLIENT
        assert realm.fetches == 2

        realm.add_key("k3", publish=False)
        stranger = realm.token("k3")
        with pytest.raises(TokenRefused, match="does not publish"):
            verifier.verify(stranger)  # the cooldown since k2's refetch has not passed
        assert realm.fetches == 2

    run(with_verifier(scenario))


def test_a_fetch_for_an_unknown_kid_is_shared_by_every_request_waiting_on_it() -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        realm.add_key("k2")
        tokens = [realm.token("k2", jti=str(n)) for n in range(20)]
        assert all(verifier.verify(token) is None for token in tokens)
        verified = await asyncio.gather(*(verifier.verify_after_fetch(t) for t in tokens))
        assert {v.client_id for v in verified} == {CLIENT}
        assert realm.fetches == 2

    run(with_verifier(scenario))


def test_with_the_realm_unreachable_known_keys_still_verify_and_a_new_kid_is_a_503() -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        realm.down = True
        assert verifier.verify(realm.token(jti="fresh")) is not None  # k1 is in memory
        realm.add_key("k2")
        rotated = realm.token("k2")
        assert verifier.verify(rotated) is None
        with pytest.raises(KeysUnavailable):
            await verifier.verify_after_fetch(rotated)
        # Within the cooldown the next one is answered at once, without a fetch.
        fetches = realm.fetches
        with pytest.raises(KeysUnavailable):
            verifier.verify(realm.token("k2", jti="again"))
        assert realm.fetches == fetches

    run(with_verifier(scenario))


def test_the_background_refresh_picks_up_a_new_key_set() -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        realm.add_key("k2")
        for _ in range(250):
            if realm.fetches >= 3:
                break
            await asyncio.sleep(0.02)
        # Fetched in the background: a k2 token verifies without its request waiting.
        assert verifier.verify(realm.token("k2")) is not None

    run(with_verifier(scenario, refresh_s=0.1))


@pytest.mark.parametrize(
    ("changes", "options", "reason"),
    [
        ({"exp": int(time.time()) - 60, "iat": int(time.time()) - 360}, {}, "has expired"),
        ({"iss": "http://127.0.0.1:1/realms/elsewhere"}, {}, f"not issued by {ISSUER}"),
        ({"aud": "reports-api"}, {}, "not meant for this API"),
        ({"iat": None}, {}, "no 'iat' claim"),
        ({"azp": None}, {}, "names no client"),
        ({"preferred_username": "alice"}, {}, "Only service-account tokens"),
        ({"preferred_username": None}, {}, "Only service-account tokens"),
        ({}, {"clients": ["someone-else"]}, f"Client '{CLIENT}' may not use this API"),
    ],
    ids=[
        "expired",
        "issuer",
        "audience",
        "no-iat",
        "no-client",
        "persons-token",
        "no-username",
        "not-allowed",
    ],
)
def test_tokens_that_break_a_rule_are_refused_saying_which(changes, options, reason) -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        with pytest.raises(TokenRefused, match=reason):
            verifier.verify(realm.token(jti="probe", **changes))

    run(with_verifier(scenario, **options))


def test_a_token_signed_with_another_algorithm_or_tampered_is_refused() -> None:
    async def scenario(realm: Realm, verifier: TokenVerifier) -> None:
        hs256 = jwt.encode({"azp": CLIENT}, "x" * 32, algorithm="HS256", headers={"kid": "k1"})
        with pytest.raises(TokenRefused, match="must be signed with RS256"):
            verifier.verify(hs256.encode())
        header, payload, signature = realm.token(jti="t").decode().split(".")
        flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
        with pytest.raises(TokenRefused, match="signature does not verify"):
            verifier.verify(f"{header}.{payload}.{flipped}".encode())
        with pytest.raises(TokenRefused, match="not a well-formed JWT"):
            verifier.verify(b"not.a.jwt")

    run(with_verifier(scenario))


def test_only_rs256_signing_keys_with_a_kid_are_taken_from_a_key_set() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    document = {
        "keys": [
            public_jwk(key, "sig-key"),
            public_jwk(key, "enc-key", use="enc", alg="RSA-OAEP"),
            {k: v for k, v in public_jwk(key, "x").items() if k != "kid"},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": "", "y": ""},
        ]
    }
    assert set(signing_keys(document)) == {"sig-key"}
