"""The backing store: the real files bucket, called over S3 with the service's credentials.

One pooled ``httpx.AsyncClient`` per process with explicit limits and timeouts. Requests are
signed with botocore's ``S3SigV4Auth``; streamed bodies go ``UNSIGNED-PAYLOAD`` (the endpoint
already checked them), small XML bodies signed. Every response is read or closed here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from s3endpoint.errors import S3Error

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_UNSIGNED_CONFIG = Config(s3={"payload_signing_enabled": False})
_SIGNED_CONFIG = Config(s3={"payload_signing_enabled": True})


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    endpoint_url: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    region: str


def store_xml(content: bytes) -> ElementTree.Element:
    """Parse an answer of the backing store (ours, trusted); a client's XML is never parsed:
    a CompleteMultipartUpload part list is passed on as it came."""
    return ElementTree.fromstring(content)  # noqa: S314 - the store's answer, see above


def xml_text(element: ElementTree.Element, name: str) -> str:
    """A child's text, namespaced or not (SeaweedFS and AWS differ in what they send)."""
    found = element.find(NS + name)
    if found is None:
        found = element.find(name)
    return (found.text or "") if found is not None else ""


def xml_all(element: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return element.findall(NS + name) + element.findall(name)


class Upstream:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self._credentials = Credentials(settings.access_key_id, settings.secret_access_key)
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            timeout=httpx.Timeout(120.0, connect=5.0),
        )

    async def close(self) -> None:
        await self.client.aclose()

    def _url(self, key: str | None, query: Mapping[str, str] | None) -> str:
        url = f"{self.settings.endpoint_url.rstrip('/')}/{self.settings.bucket}"
        if key is not None:
            url += "/" + quote(key, safe="/-_.~")
        if query:
            url += "?" + "&".join(
                f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" if v != "" else quote(k)
                for k, v in sorted(query.items())
            )
        return url

    def _signed(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
        request.context["client_config"] = _SIGNED_CONFIG if body is not None else _UNSIGNED_CONFIG
        S3SigV4Auth(self._credentials, "s3", self.settings.region).add_auth(request)
        return dict(request.headers.items())

    async def call(
        self,
        method: str,
        key: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        stream: AsyncIterator[bytes] | None = None,
        length: int | None = None,
    ) -> httpx.Response:
        """One request, its response read whole (S3's answers to these calls are small)."""
        url = self._url(key, query)
        sent = dict(headers or {})
        if stream is not None:
            sent["Content-Length"] = str(length or 0)
        signed = self._signed(method, url, sent, body if stream is None else None)
        content: Any = stream if stream is not None else body
        try:
            response = await self.client.request(method, url, headers=signed, content=content)
        except httpx.HTTPError as exc:
            raise S3Error(
                "ServiceUnavailable",
                f"The backing store cannot be reached ({exc.__class__.__name__}).",
            ) from exc
        return response

    async def ok(self, response: httpx.Response) -> httpx.Response:
        """Map the store's refusal to ours; a 200 carrying an <Error> is a refusal too."""
        if response.status_code < 300 and b"<Error>" not in response.content[:512]:
            return response
        code = "InternalError"
        message = "The backing store refused the request."
        try:
            root = store_xml(response.content)
            code = xml_text(root, "Code") or code
            message = xml_text(root, "Message") or message
        except ElementTree.ParseError:
            pass
        if code in {"NoSuchUpload", "InvalidPart", "InvalidPartOrder", "EntityTooSmall"}:
            raise S3Error(code, message, status=400 if code != "NoSuchUpload" else 404)
        raise S3Error(
            "InternalError" if response.status_code >= 500 else code,
            message,
            status=502 if response.status_code >= 500 else response.status_code,
        )
