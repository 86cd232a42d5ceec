"""The S3 operations the endpoint serves, each mapped onto the real files bucket.

Uploads: PutObject, and multipart (Create / UploadPart / Complete / Abort / ListParts) passed
through to the backing store with its own upload ids. Probes and reads of one's own uploads:
HeadObject, HeadBucket, GetBucketLocation, ListBuckets, ListObjectsV2. Nothing else: a GET of
an object's bytes, deletes and copies are refused (the endpoint is a door in, not a store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from s3endpoint import registrations
from s3endpoint.errors import S3Error
from s3endpoint.markers import IN_FLIGHT_TTL, MULTIPART_TTL, PUT, Markers
from s3endpoint.payload import BodyCheck, Receive, decoded_body, hold_back_last
from s3endpoint.principals import Principal
from s3endpoint.registrations import Target
from s3endpoint.sigv4 import Incoming
from s3endpoint.upstream import Upstream, store_xml, xml_all, xml_text
from scheduler.files.upload_events import MULTIPART_MARKER_PREFIX, UploadEvent

logger = logging.getLogger("s3endpoint")

MAX_PARTS = 10_000
DISCARD_ATTEMPTS = 10  # about 3 s of checking at most, on a refused PutObject only
MAX_XML_BODY = 1024 * 1024
_PASSED_HEADERS = ("content-type", "content-md5")
_XMLNS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def _xml(root: str, inner: str) -> Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} {_XMLNS}>{inner}</{root}>'
    return Response(200, [("content-type", "application/xml")], body.encode())


def _el(name: str, value: object) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def _passed(incoming: Incoming) -> dict[str, str]:
    return {name: value for name in _PASSED_HEADERS if (value := incoming.header(name))}


def _multipart_marker(upload_id: str) -> str:
    return f"{MULTIPART_MARKER_PREFIX}{upload_id}"


def _part_number(incoming: Incoming) -> int:
    raw = dict(incoming.query_params()).get("partNumber", "")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"partNumber must be between 1 and {MAX_PARTS}.")
    return int(raw)


class Operations:
    def __init__(self, upstream: Upstream, markers: Markers, region: str) -> None:
        self.upstream = upstream
        self.markers = markers
        self.region = region

    # --- uploads ------------------------------------------------------------------------
    async def put_object(
        self, principal: Principal, key: str, incoming: Incoming, receive: Receive, check: BodyCheck
    ) -> Response:
        target = await registrations.target(principal, key)
        _fits(check.expected_length, target)
        if not await self.markers.claim(target.registration_id, PUT, IN_FLIGHT_TTL):
            raise _already(target)
        try:
            response = await self.upstream.call(
                "PUT",
                target.object_name,
                headers=_passed(incoming),
                stream=hold_back_last(decoded_body(receive, check)),
                length=check.expected_length,
            )
            await self.upstream.ok(response)
        except BaseException:
            # Some stores (SeaweedFS) keep what arrived before the connection dropped: the
            # marker is ours, so no one else's upload is at this name to delete by mistake.
            with contextlib.suppress(S3Error):
                await self._discard(target.object_name)
            await self.markers.release(target.registration_id, PUT)
            raise
        etag = response.headers.get("etag", "")
        await self._finished(principal, target, check.length, check.sha256, etag)
        return Response(200, [("etag", etag)])

    async def _discard(self, object_name: str) -> None:
        """Delete what an aborted PutObject left, until the store shows nothing twice in a
        row: the store may finish the aborted write after our first DELETE (SeaweedFS does)."""
        absent = 0
        await asyncio.sleep(0.25)  # the store notices the dropped connection meanwhile
        for attempt in range(DISCARD_ATTEMPTS):
            response = await self.upstream.call("HEAD", object_name)
            if response.status_code == 404:
                absent += 1
                if absent == 2:
                    return
            else:
                absent = 0
                await self.upstream.call("DELETE", object_name)
            await asyncio.sleep(0.05 * (attempt + 1))
        logger.warning("s3_discard_incomplete object=%s", object_name)

    async def create_multipart(
        self, principal: Principal, key: str, incoming: Incoming
    ) -> Response:
        target = await registrations.target(principal, key)
        pending = _multipart_marker("pending")
        if not await self.markers.claim(target.registration_id, pending, MULTIPART_TTL):
            raise _already(target)
        try:
            response = await self.upstream.ok(
                await self.upstream.call(
                    "POST", target.object_name, query={"uploads": ""}, headers=_passed(incoming)
                )
            )
            upload_id = xml_text(store_xml(response.content), "UploadId")
            if not upload_id:
                raise S3Error("InternalError", "The backing store gave no upload id.")
        except BaseException:
            await self.markers.release(target.registration_id, pending)
            raise
        await self.markers.set(target.registration_id, _multipart_marker(upload_id), MULTIPART_TTL)
        return _xml(
            "InitiateMultipartUploadResult",
            _el("Bucket", principal.bucket) + _el("Key", key) + _el("UploadId", upload_id),
        )

    async def _multipart_target(self, principal: Principal, key: str, upload_id: str) -> Target:
        target = await registrations.target(principal, key)
        if await self.markers.value(target.registration_id) != _multipart_marker(upload_id):
            raise S3Error("NoSuchUpload", "The specified multipart upload does not exist.")
        return target

    async def upload_part(
        self,
        principal: Principal,
        key: str,
        upload_id: str,
        incoming: Incoming,
        receive: Receive,
        check: BodyCheck,
    ) -> Response:
        if incoming.header("x-amz-copy-source"):
            raise S3Error("NotImplemented", "UploadPartCopy is not supported.")
        part = _part_number(incoming)
        target = await self._multipart_target(principal, key, upload_id)
        _fits(check.expected_length, target)
        if not await self.markers.reserve_part(
            target.registration_id, part, check.expected_length, target.max_bytes
        ):
            raise _too_large(target)
        response = await self.upstream.ok(
            await self.upstream.call(
                "PUT",
                target.object_name,
                query={"partNumber": str(part), "uploadId": upload_id},
                headers=_passed(incoming),
                stream=hold_back_last(decoded_body(receive, check)),
                length=check.expected_length,
            )
        )
        return Response(200, [("etag", response.headers.get("etag", ""))])

    async def complete_multipart(
        self,
        principal: Principal,
        key: str,
        upload_id: str,
        receive: Receive,
        check: BodyCheck,
    ) -> Response:
        target = await self._multipart_target(principal, key, upload_id)
        if check.expected_length > MAX_XML_BODY:
            raise S3Error("MalformedXML", "The part list is too long.")
        body = b"".join([piece async for piece in decoded_body(receive, check)])
        response = await self.upstream.ok(
            await self.upstream.call(
                "POST", target.object_name, query={"uploadId": upload_id}, body=body
            )
        )
        etag = xml_text(store_xml(response.content), "ETag")
        head = await self.upstream.ok(await self.upstream.call("HEAD", target.object_name))
        size = int(head.headers.get("content-length", "0"))
        if size > target.max_bytes:
            await self.upstream.call("DELETE", target.object_name)
            await self.markers.release(target.registration_id, _multipart_marker(upload_id))
            raise _too_large(target)
        await self._finished(principal, target, size, "", etag)
        return _xml(
            "CompleteMultipartUploadResult",
            _el("Location", f"/{principal.bucket}/{key}")
            + _el("Bucket", principal.bucket)
            + _el("Key", key)
            + _el("ETag", etag),
        )

    async def abort_multipart(self, principal: Principal, key: str, upload_id: str) -> Response:
        target = await self._multipart_target(principal, key, upload_id)
        response = await self.upstream.call(
            "DELETE", target.object_name, query={"uploadId": upload_id}
        )
        if response.status_code != 404:
            await self.upstream.ok(response)
        await self.markers.release(target.registration_id, _multipart_marker(upload_id))
        return Response(204)

    async def list_parts(
        self, principal: Principal, key: str, upload_id: str, incoming: Incoming
    ) -> Response:
        target = await self._multipart_target(principal, key, upload_id)
        params = dict(incoming.query_params())
        query = {"uploadId": upload_id}
        for name in ("max-parts", "part-number-marker"):
            if name in params:
                query[name] = params[name]
        response = await self.upstream.ok(
            await self.upstream.call("GET", target.object_name, query=query)
        )
        root = store_xml(response.content)
        parts = "".join(
            "<Part>"
            + _el("PartNumber", xml_text(part, "PartNumber"))
            + _el("LastModified", xml_text(part, "LastModified"))
            + _el("ETag", xml_text(part, "ETag"))
            + _el("Size", xml_text(part, "Size"))
            + "</Part>"
            for part in xml_all(root, "Part")
        )
        return _xml(
            "ListPartsResult",
            _el("Bucket", principal.bucket)
            + _el("Key", key)
            + _el("UploadId", upload_id)
            + _el("IsTruncated", xml_text(root, "IsTruncated") or "false")
            + (
                _el("NextPartNumberMarker", marker)
                if (marker := xml_text(root, "NextPartNumberMarker"))
                else ""
            )
            + parts,
        )

    async def _finished(
        self, principal: Principal, target: Target, size: int, sha256: str, etag: str
    ) -> None:
        event = UploadEvent(
            registration_id=target.registration_id,
            object_name=target.object_name,
            size=size,
            sha256=sha256,
            etag=etag.strip('"'),
            uploader=principal.uploader,
            uploaded_at=time.time(),
        )
        await self.markers.finish(target.registration_id, event)

    # --- probes and listings ------------------------------------------------------------
    async def head_object(self, principal: Principal, key: str) -> Response:
        target = await registrations.target(principal, key, for_upload=False)
        response = await self.upstream.call("HEAD", target.object_name)
        if response.status_code == 404:
            return Response(404)
        await self.upstream.ok(response)
        headers = [
            (name, value)
            for name in ("content-length", "etag", "last-modified", "content-type")
            if (value := response.headers.get(name))
        ]
        return Response(200, headers)

    def head_bucket(self) -> Response:
        return Response(200, [("x-amz-bucket-region", self.region)])

    def bucket_location(self) -> Response:
        region = "" if self.region == "us-east-1" else self.region
        return _xml("LocationConstraint", escape(region))

    def list_buckets(self, principal: Principal) -> Response:
        bucket = f"<Bucket>{_el('Name', principal.bucket)}</Bucket>"
        owner = f"<Owner>{_el('ID', principal.access_key_id)}</Owner>"
        return _xml("ListAllMyBucketsResult", f"{owner}<Buckets>{bucket}</Buckets>")

    async def list_objects(self, principal: Principal, params: dict[str, str]) -> Response:
        base = registrations.object_prefix(principal)
        prefix = params.get("prefix", "")
        max_keys = params.get("max-keys", "1000")
        if not max_keys.isdigit():
            raise S3Error("InvalidArgument", "max-keys must be a number.")
        query = {
            "list-type": "2",
            "prefix": base + prefix,
            "max-keys": str(min(int(max_keys), 1000)),
        }
        for name in ("delimiter", "continuation-token"):
            if params.get(name):
                query[name] = params[name]
        if params.get("start-after"):
            query["start-after"] = base + params["start-after"]
        response = await self.upstream.ok(await self.upstream.call("GET", None, query=query))
        root = store_xml(response.content)
        contents = _contents(xml_all(root, "Contents"), base)
        prefixes = "".join(
            "<CommonPrefixes>"
            + _el("Prefix", xml_text(item, "Prefix").removeprefix(base))
            + "</CommonPrefixes>"
            for item in xml_all(root, "CommonPrefixes")
        )
        count = len(xml_all(root, "Contents")) + len(xml_all(root, "CommonPrefixes"))
        token = xml_text(root, "NextContinuationToken")
        return _xml(
            "ListBucketResult",
            _el("Name", principal.bucket)
            + _el("Prefix", prefix)
            + _el("KeyCount", count)
            + _el("MaxKeys", query["max-keys"])
            + (_el("Delimiter", params["delimiter"]) if params.get("delimiter") else "")
            + _el("IsTruncated", xml_text(root, "IsTruncated") or "false")
            + (_el("NextContinuationToken", token) if token else "")
            + contents
            + prefixes,
        )


def _contents(items: Sequence[ElementTree.Element], base: str) -> str:
    return "".join(
        "<Contents>"
        + _el("Key", xml_text(item, "Key").removeprefix(base))
        + _el("LastModified", xml_text(item, "LastModified"))
        + _el("ETag", xml_text(item, "ETag"))
        + _el("Size", xml_text(item, "Size"))
        + _el("StorageClass", "STANDARD")
        + "</Contents>"
        for item in items
    )


def _too_large(target: Target) -> S3Error:
    return S3Error(
        "EntityTooLarge",
        f"Registration {target.registration_id} accepts at most {target.max_bytes} bytes "
        "(its declared size plus slack, within its SLA class's limit).",
    )


def _fits(size: int, target: Target) -> None:
    if size > target.max_bytes:
        raise _too_large(target)


def _already(target: Target) -> S3Error:
    return S3Error(
        "ConditionalRequestConflict",
        f"Registration {target.registration_id} is already being uploaded or was uploaded.",
    )
