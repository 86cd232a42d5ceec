"""Keycloak service-account tokens on /v1: verify a bearer JWT against the realm's keys.

The rules are those of /api/ (governance/api/authentication.py): RS256 only, signed by a key
the realm publishes (by ``kid``), ``iss`` the realm, ``exp`` and ``iat`` required (with
leeway), the audience when one is configured, ``azp`` (or ``client_id``) naming the client —
on the allow-list when there is one — and ``preferred_username`` ``service-account-<client>``,
so a person's token is refused. Which use case a client acts as is policy, looked up by the
caller on every request, so suspending a use case stops tokens already verified.

Nothing here makes a request wait on the identity provider, with one exception. The key set
is fetched with aiohttp at start-up and refreshed in the background; a verified token is
remembered by its SHA-256 until it expires, so a busy client costs a dict lookup a request,
not an RSA verification. Only a token naming a ``kid`` the set does not hold (Keycloak
publishes a new key before it signs with it) makes its request await one refetch, and such
refetches happen at most every ``unknown_kid_cooldown_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import jwt

from gateway.settings import ServiceAccountSettings

logger = logging.getLogger("gateway.service_accounts")

ALGORITHM: Final = "RS256"
SERVICE_ACCOUNT_PREFIX: Final = "service-account-"


class TokenRefused(Exception):
    """The token is not a valid service-account token; the message says why (a 401)."""


class KeysUnavailable(Exception):
    """The realm's keys cannot be fetched and none is known for this token's ``kid`` (a 503)."""


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    client_id: str
    valid_until: float  # wall clock: ``exp`` plus the leeway a fresh verification allows


class TokenVerifier:
    """One per gateway process: ``start()`` in lifespan, ``verify()`` per request."""

    def __init__(
        self,
        settings: ServiceAccountSettings,
        *,
        refresh_s: float = 300.0,
        retry_s: float = 5.0,
        unknown_kid_cooldown_s: float = 30.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._refresh_s = refresh_s
        self._retry_s = retry_s  # while the last fetch failed, the background retries sooner
        self._cooldown_s = unknown_kid_cooldown_s
        self._cache_size = cache_size
        self._clock = clock
        self._keys: Mapping[str, jwt.PyJWK] = {}
        self._healthy = False  # the last fetch succeeded (so a missing kid is the token's fault)
        self._unknown_kid_fetch_at = -math.inf
        self._fetching: asyncio.Task[None] | None = None
        self._verified: dict[bytes, VerifiedToken] = {}
        self._session: aiohttp.ClientSession | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.verifications = 0  # signature checks made, i.e. cache misses that got that far

    @property
    def cached(self) -> int:
        """Verified tokens remembered now (bounded by ``cache_size``)."""
        return len(self._verified)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin fetching the key set in the background; start-up never waits on the IdP."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
            connector=aiohttp.TCPConnector(limit=4, ssl=self.settings.verify_ssl),
        )
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def close(self) -> None:
        tasks = [t for t in (self._refresher, self._fetching) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2)
        if self._session is not None:
            await self._session.close()

    # --- the request path -----------------------------------------------------------------
    def verify(self, token: bytes) -> VerifiedToken | None:
        """The token's client, without I/O; TokenRefused or KeysUnavailable when it fails.

        None when the token names a key the set does not hold and a refetch may find it:
        then ``verify_after_fetch`` is what to await.
        """
        return self._verify(token, may_fetch=True)

    async def verify_after_fetch(self, token: bytes) -> VerifiedToken:
        """Refetch the key set (or join the refetch under way), then verify for good."""
        if self._fetching is None and self._may_refetch():
            self._unknown_kid_fetch_at = time.monotonic()
            self._fetching = asyncio.create_task(self._fetch())
        if self._fetching is not None:
            # Shielded: a caller that goes away must not cancel a fetch others wait on.
            await asyncio.shield(self._fetching)
        verified = self._verify(token, may_fetch=False)
        assert verified is not None
        return verified

    def _verify(self, token: bytes, *, may_fetch: bool) -> VerifiedToken | None:
        digest = hashlib.sha256(token).digest()
        known = self._verified.get(digest)
        if known is not None:
            if self._clock() < known.valid_until:
                return known
            del self._verified[digest]
            raise TokenRefused("The bearer token has expired.")
        key = self._signing_key(token, may_fetch=may_fetch)
        if key is None:
            return None
        self.verifications += 1
        claims = self._decode(token, key)
        verified = VerifiedToken(
            client_id=check_client(claims, self.settings.clients),
            valid_until=float(claims["exp"]) + self.settings.leeway_s,
        )
        self._remember(digest, verified)
        return verified

    def _signing_key(self, token: bytes, *, may_fetch: bool) -> jwt.PyJWK | None:
        kid = signing_kid(token)
        key = self._keys.get(kid)
        if key is not None:
            return key
        if may_fetch and (self._fetching is not None or self._may_refetch()):
            return None
        if not self._healthy:
            raise KeysUnavailable(
                "The identity provider's signing keys cannot be fetched right now."
            )
        raise TokenRefused(
            "The bearer token is signed by a key the identity provider does not publish."
        )

    def _may_refetch(self) -> bool:
        return time.monotonic() - self._unknown_kid_fetch_at >= self._cooldown_s

    def _decode(self, token: bytes, key: jwt.PyJWK) -> dict[str, Any]:
        settings = self.settings
        return decode_claims(
            token,
            key,
            issuer=settings.issuer,
            audience=settings.audience,
            leeway_s=settings.leeway_s,
        )

    def _remember(self, digest: bytes, verified: VerifiedToken) -> None:
        if len(self._verified) >= self._cache_size:
            now = self._clock()
            for stale in [d for d, v in self._verified.items() if v.valid_until <= now]:
                del self._verified[stale]
            if len(self._verified) >= self._cache_size:
                # Still full of live tokens: forget the oldest tenth (dicts keep insertion
                # order), so sweeping stays rare however many clients there are.
                oldest = list(itertools.islice(self._verified, max(1, self._cache_size // 10)))
                for stale in oldest:
                    del self._verified[stale]
        self._verified[digest] = verified

    # --- the key set ----------------------------------------------------------------------
    async def _refresh_forever(self) -> None:
        while True:
            if self._fetching is None:
                self._fetching = asyncio.create_task(self._fetch())
            try:
                await asyncio.shield(self._fetching)
            except Exception:  # a bug in a fetch must not end the refreshing for good
                logger.exception("oidc_keys_refresh_failed")
            await asyncio.sleep(self._refresh_s if self._healthy else self._retry_s)

    async def _fetch(self) -> None:
        assert self._session is not None, "start() first"
        url = self.settings.jwks_url
        try:
            async with self._session.get(url) as response:
                if response.status != 200:
                    raise KeySetError(f"HTTP {response.status}")
                document = await response.json(content_type=None)
            keys = signing_keys(document)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeySetError) as exc:
            self._healthy = False
            logger.warning("oidc_keys_fetch_failed url=%s error=%s", url, _describe(exc))
        else:
            changed = keys.keys() != self._keys.keys()
            self._keys = keys
            self._healthy = True
            if changed:
                logger.info("oidc_keys_fetched url=%s kids=%s", url, ",".join(sorted(keys)))
        finally:
            self._fetching = None


class KeySetError(Exception):
    """The JWKS endpoint answered, but not with a usable key set."""


def signing_keys(document: object) -> dict[str, jwt.PyJWK]:
    """The RS256 signing keys of a JWKS document, by ``kid``; Keycloak also publishes an
    encryption key (``use: enc``), and a key without a ``kid`` cannot be chosen by a token."""
    raw = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(raw, list):
        raise KeySetError("the document has no 'keys' list")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in raw:
        if not isinstance(entry, dict) or entry.get("kty") != "RSA":
            continue
        if entry.get("use", "sig") != "sig" or entry.get("alg", ALGORITHM) != ALGORITHM:
            continue
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid:
            continue
        try:
            keys[kid] = jwt.PyJWK(entry, algorithm=ALGORITHM)
        except jwt.PyJWTError as exc:
            logger.warning("oidc_key_unusable kid=%s error=%s", kid, exc)
    if not keys:
        raise KeySetError(f"no {ALGORITHM} signing key in the key set")
    return keys


def signing_kid(token: bytes | str) -> str:
    """The ``kid`` of the key a token says it is signed with, once its header shows an RS256
    JWT; TokenRefused otherwise. Shared with /api/, like decode_claims."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError as exc:
        raise TokenRefused("The bearer token is not a well-formed JWT.") from exc
    if header.get("alg") != ALGORITHM:
        raise TokenRefused(f"The bearer token must be signed with {ALGORITHM}.")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise TokenRefused("The bearer token names no signing key (kid).")
    return kid


def decode_claims(
    token: bytes | str, key: Any, *, issuer: str, audience: str, leeway_s: float
) -> dict[str, Any]:
    """The claims of a token signed by ``key``, with the checks every service-account token
    must pass (issuer, expiry, issued-at, audience when set); TokenRefused says what failed.
    Shared with /api/ (governance/api/authentication.py), so both refuse alike."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            issuer=issuer,
            audience=audience or None,
            leeway=leeway_s,
            options={"require": ["exp", "iat", "iss"], "verify_aud": bool(audience)},
        )
    except jwt.ExpiredSignatureError as exc:
        raise TokenRefused("The bearer token has expired.") from exc
    except jwt.InvalidIssuerError as exc:
        raise TokenRefused(f"The bearer token was not issued by {issuer}.") from exc
    except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
        if isinstance(exc, jwt.MissingRequiredClaimError) and exc.claim != "aud":
            raise TokenRefused(f"The bearer token has no {exc.claim!r} claim.") from exc
        raise TokenRefused(
            f"The bearer token is not meant for this API (its audience must include {audience!r})."
        ) from exc
    except jwt.InvalidSignatureError as exc:
        raise TokenRefused("The bearer token's signature does not verify.") from exc
    except jwt.ImmatureSignatureError as exc:
        raise TokenRefused("The bearer token is not valid yet.") from exc
    except jwt.PyJWTError as exc:
        raise TokenRefused(f"The bearer token is invalid: {exc}.") from exc
    return claims


def check_client(
    claims: Mapping[str, Any], allowed: frozenset[str] | set[str] | tuple[str, ...]
) -> str:
    """The client a service-account token was issued to (``azp``), on the allow-list when
    there is one; a person's token obtained through the same client is refused."""
    client = claims.get("azp") or claims.get("client_id")
    if not isinstance(client, str) or not client:
        raise TokenRefused("The bearer token names no client (azp).")
    if allowed and client not in allowed:
        raise TokenRefused(f"Client {client!r} may not use this API.")
    # Keycloak names a client's service account "service-account-<client_id>", lowercased
    # as it does every username; a person's token through the same client carries their own.
    username = claims.get("preferred_username")
    expected = SERVICE_ACCOUNT_PREFIX + client
    if username not in (expected, expected.lower()):
        raise TokenRefused(
            "Only service-account tokens (client-credentials grant) are accepted on the API."
        )
    return client


def _describe(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
