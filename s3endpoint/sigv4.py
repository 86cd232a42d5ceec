"""AWS Signature V4 checks, by recomputing the signature with botocore's own signer.

No hand-written HMAC chain: the incoming request is rebuilt as a botocore ``AWSRequest`` with
exactly the headers the client signed, and ``S3SigV4Auth`` (header auth) or
``S3SigV4QueryAuth`` (presigned URLs) computes the canonical request, the string to sign and
the signature the client must have sent; the two are compared in constant time. The
chunk signatures of ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` bodies are chained from the seed
signature with the same signer (``ChunkChain``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials

from s3endpoint.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"
MAX_SKEW = timedelta(minutes=15)
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600  # S3's own limit
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class Incoming:
    """What the signature covers, as it came over the wire (path and query still encoded)."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]  # names lower-case, in arrival order

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def query_params(self) -> list[tuple[str, str]]:
        from urllib.parse import parse_qsl

        return parse_qsl(self.query, keep_blank_values=True)


@dataclass(frozen=True, slots=True)
class Authorization:
    """The parsed claim: whose key, for which scope, over which headers, signed when."""

    access_key_id: str
    date: str  # yyyymmdd of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    timestamp: str  # X-Amz-Date
    presigned: bool
    expires: int | None  # X-Amz-Expires of a presigned URL


def _scope(credential: str) -> tuple[str, str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise S3Error(
            "AuthorizationHeaderMalformed",
            "The credential must be <access key>/<date>/<region>/s3/aws4_request.",
            status=400,
        )
    if parts[3] != "s3":
        raise S3Error("AccessDenied", f"This endpoint signs for service s3, not {parts[3]!r}.")
    return parts[0], parts[1], parts[2], parts[3]


def parse(incoming: Incoming) -> Authorization:
    """The request's SigV4 claim (header or query); anonymous and SigV2 requests are refused."""
    header = incoming.header("authorization")
    if header is not None:
        return _parse_header(header, incoming)
    params = dict(incoming.query_params())
    if "X-Amz-Signature" in params or "X-Amz-Credential" in params:
        return _parse_query(params)
    if "Signature" in params or "AWSAccessKeyId" in params:
        raise S3Error("InvalidRequest", "Signature Version 2 is not supported; use SigV4.")
    raise S3Error("AccessDenied", "Anonymous requests are not accepted; sign with SigV4.")


def _parse_header(header: str, incoming: Incoming) -> Authorization:
    algorithm, _, rest = header.partition(" ")
    if algorithm != ALGORITHM:
        raise S3Error("InvalidRequest", f"Only {ALGORITHM} is supported (SigV2 is not).")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name] = value
    try:
        credential, signed, signature = (
            fields["Credential"],
            fields["SignedHeaders"],
            fields["Signature"],
        )
    except KeyError as exc:
        raise S3Error(
            "AuthorizationHeaderMalformed", f"The Authorization header lacks {exc}.", status=400
        ) from exc
    timestamp = incoming.header("x-amz-date") or ""
    key, date, region, service = _scope(credential)
    return Authorization(
        access_key_id=key,
        date=date,
        region=region,
        service=service,
        signed_headers=tuple(signed.split(";")),
        signature=signature,
        timestamp=timestamp,
        presigned=False,
        expires=None,
    )


def _parse_query(params: dict[str, str]) -> Authorization:
    missing = [
        name
        for name in (
            "X-Amz-Algorithm",
            "X-Amz-Credential",
            "X-Amz-Date",
            "X-Amz-Expires",
            "X-Amz-SignedHeaders",
            "X-Amz-Signature",
        )
        if name not in params
    ]
    if missing:
        raise S3Error(
            "AuthorizationQueryParametersError", f"The presigned URL lacks {', '.join(missing)}."
        )
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise S3Error("AuthorizationQueryParametersError", f"X-Amz-Algorithm must be {ALGORITHM}.")
    try:
        expires = int(params["X-Amz-Expires"])
    except ValueError as exc:
        raise S3Error(
            "AuthorizationQueryParametersError", "X-Amz-Expires must be a number of seconds."
        ) from exc
    if not 1 <= expires <= MAX_PRESIGN_EXPIRES:
        raise S3Error(
            "AuthorizationQueryParametersError",
            f"X-Amz-Expires must be between 1 and {MAX_PRESIGN_EXPIRES} seconds.",
        )
    key, date, region, service = _scope(params["X-Amz-Credential"])
    return Authorization(
        access_key_id=key,
        date=date,
        region=region,
        service=service,
        signed_headers=tuple(params["X-Amz-SignedHeaders"].split(";")),
        signature=params["X-Amz-Signature"],
        timestamp=params["X-Amz-Date"],
        presigned=True,
        expires=expires,
    )


def check_time(auth: Authorization, now: datetime | None = None) -> None:
    """Header-signed requests within 15 minutes of our clock; presigned URLs until expiry."""
    now = now or datetime.now(UTC)
    try:
        signed_at = datetime.strptime(auth.timestamp, TIMESTAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:
        raise S3Error(
            "AccessDenied", "X-Amz-Date is missing or not in the form 20260101T000000Z."
        ) from exc
    if auth.timestamp[:8] != auth.date:
        raise S3Error("SignatureDoesNotMatch", "The credential scope's date is not X-Amz-Date's.")
    if auth.presigned:
        assert auth.expires is not None
        if signed_at - now > MAX_SKEW:
            raise S3Error("RequestTimeTooSkewed", "The presigned URL is dated in the future.")
        if now > signed_at + timedelta(seconds=auth.expires):
            raise S3Error("AccessDenied", "Request has expired")
        return
    if abs(now - signed_at) > MAX_SKEW:
        raise S3Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the server's time is too large.",
        )


def _rebuilt(incoming: Incoming, auth: Authorization) -> AWSRequest:
    """The request as the client's signer saw it: the signed headers only, and for a presigned
    URL the query without its signature."""
    headers = HTTPHeaders()
    for name in auth.signed_headers:
        values = [value for key, value in incoming.headers if key == name]
        if not values:
            raise S3Error("AccessDenied", f"The signed header {name!r} is not in the request.")
        for value in values:
            headers[name] = value  # HTTPHeaders appends: repeated headers stay repeated
    if "host" not in auth.signed_headers:
        raise S3Error("AccessDenied", "The Host header must be signed.")
    if not auth.presigned and "x-amz-content-sha256" not in auth.signed_headers:
        # Unsigned, the payload mode could be swapped for UNSIGNED-PAYLOAD and the body with it.
        raise S3Error("AccessDenied", "The x-amz-content-sha256 header must be signed.")
    query = incoming.query
    if auth.presigned:
        query = "&".join(
            pair for pair in query.split("&") if pair.partition("=")[0] != "X-Amz-Signature"
        )
    url = f"http://{incoming.header('host')}{incoming.path}" + (f"?{query}" if query else "")
    request = AWSRequest(method=incoming.method, url=url, headers=headers)
    request.context["timestamp"] = auth.timestamp
    return request


def _signer(auth: Authorization, secret: str) -> S3SigV4Auth:
    credentials = Credentials(auth.access_key_id, secret)
    if auth.presigned:
        assert auth.expires is not None
        return S3SigV4QueryAuth(credentials, auth.service, auth.region, expires=auth.expires)
    return S3SigV4Auth(credentials, auth.service, auth.region)


@dataclass
class ChunkChain:
    """Verifies the signature of each chunk of a ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` body:
    each signs the chunk's hash and the previous signature, the first the seed signature."""

    signer: S3SigV4Auth
    request: AWSRequest
    previous: str

    def verify(self, chunk_sha256: str, signature: str) -> None:
        string_to_sign = "\n".join(
            (
                "AWS4-HMAC-SHA256-PAYLOAD",
                self.request.context["timestamp"],
                self.signer.credential_scope(self.request),
                self.previous,
                EMPTY_SHA256,
                chunk_sha256,
            )
        )
        expected = self.signer.signature(string_to_sign, self.request)
        if not hmac.compare_digest(expected, signature):
            raise S3Error(
                "SignatureDoesNotMatch", "A chunk's signature does not match its content."
            )
        self.previous = expected


def verify(incoming: Incoming, auth: Authorization, secret: str) -> ChunkChain:
    """Raise SignatureDoesNotMatch unless the client signed this request with ``secret``;
    returns the chain that signed chunks continue from."""
    request = _rebuilt(incoming, auth)
    signer = _signer(auth, secret)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, auth.signature):
        raise S3Error(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method.",
        )
    return ChunkChain(signer=signer, request=request, previous=expected)
