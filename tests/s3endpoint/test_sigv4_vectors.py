"""The signature checks against AWS's own published example of a chunk-signed upload
(docs.aws.amazon.com, "Signature Calculations for the Authorization Header: Transferring
Payload in Multiple Chunks"), and the aws-chunked decoder against botocore's encoder.

GIVEN AWS's example request, seed signature and chunk signatures,
WHEN the endpoint's verifier and decoder read it, split at any boundary,
THEN every signature matches, the payload comes out whole, and one changed byte is refused.
"""

from __future__ import annotations

import io
import itertools
from datetime import UTC, datetime

import pytest
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum
from hypothesis import given, settings
from hypothesis import strategies as st

from s3endpoint import sigv4
from s3endpoint.errors import S3Error
from s3endpoint.payload import AwsChunkedDecoder

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
CHUNK_SIGNATURES = (
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
)
SIGNED = (
    "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
    "x-amz-decoded-content-length;x-amz-storage-class"
)
EXAMPLE = sigv4.Incoming(
    method="PUT",
    path="/examplebucket/chunkObject.txt",
    query="",
    headers=(
        ("host", "s3.amazonaws.com"),
        ("x-amz-date", "20130524T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        (
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
            f"aws4_request,SignedHeaders={SIGNED},Signature={SEED}",
        ),
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("content-length", "66824"),
    ),
)


def example_body() -> bytes:
    sizes = (65536, 1024, 0)
    return b"".join(
        f"{size:x};chunk-signature={signature}\r\n".encode() + b"a" * size + b"\r\n"
        for size, signature in zip(sizes, CHUNK_SIGNATURES, strict=True)
    )


def test_the_seed_signature_of_awss_example_is_accepted_and_a_wrong_secret_is_not() -> None:
    auth = sigv4.parse(EXAMPLE)
    sigv4.check_time(auth, now=datetime(2013, 5, 24, 0, 5, tzinfo=UTC))
    sigv4.verify(EXAMPLE, auth, SECRET)
    with pytest.raises(S3Error) as refused:
        sigv4.verify(EXAMPLE, auth, SECRET[:-1] + "X")
    assert refused.value.code == "SignatureDoesNotMatch"


def test_a_request_signed_long_ago_is_too_skewed() -> None:
    with pytest.raises(S3Error) as refused:
        sigv4.check_time(sigv4.parse(EXAMPLE), now=datetime(2013, 5, 24, 0, 16, tzinfo=UTC))
    assert refused.value.code == "RequestTimeTooSkewed"


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=66824), max_size=12))
def test_awss_signed_chunks_decode_whole_however_the_body_is_split(cuts: list[int]) -> None:
    body = example_body()
    chain = sigv4.verify(EXAMPLE, sigv4.parse(EXAMPLE), SECRET)
    decoder = AwsChunkedDecoder(chain=chain)
    out = bytearray()
    edges = [0, *sorted(cuts), len(body)]
    for start, end in itertools.pairwise(edges):
        for piece in decoder.feed(body[start:end]):
            out += piece
    decoder.finish()
    assert bytes(out) == b"a" * 66560


def test_a_changed_byte_in_a_signed_chunk_is_refused() -> None:
    body = bytearray(example_body())
    body[200] = ord("b")
    decoder = AwsChunkedDecoder(chain=sigv4.verify(EXAMPLE, sigv4.parse(EXAMPLE), SECRET))
    with pytest.raises(S3Error) as refused:
        decoder.feed(bytes(body))
    assert refused.value.code == "SignatureDoesNotMatch"


@settings(max_examples=60, deadline=None)
@given(
    payload=st.binary(max_size=5000),
    chunk=st.integers(min_value=1, max_value=2048),
    cuts=st.lists(st.integers(min_value=0, max_value=6000), max_size=10),
)
def test_the_decoder_reads_what_botocores_aws_chunked_encoder_writes(
    payload: bytes, chunk: int, cuts: list[int]
) -> None:
    encoded = AwsChunkedWrapper(
        io.BytesIO(payload),
        checksum_cls=Crc32Checksum,
        checksum_name="x-amz-checksum-crc32",
        chunk_size=chunk,
    ).read()
    decoder = AwsChunkedDecoder()
    out = bytearray()
    edges = [0, *sorted(c for c in cuts if c <= len(encoded)), len(encoded)]
    for start, end in itertools.pairwise(edges):
        for piece in decoder.feed(encoded[start:end]):
            out += piece
    decoder.finish()
    assert bytes(out) == payload
    expected = Crc32Checksum()
    expected.update(payload)
    assert decoder.trailers["x-amz-checksum-crc32"] == expected.b64digest()


def test_a_header_signature_that_leaves_the_payload_hash_unsigned_is_refused() -> None:
    """Else the payload mode, and the body with it, could be swapped under a valid signature."""
    headers = tuple(
        (name, value.replace(";x-amz-content-sha256", "") if name == "authorization" else value)
        for name, value in EXAMPLE.headers
    )
    unsigned_hash = sigv4.Incoming(EXAMPLE.method, EXAMPLE.path, EXAMPLE.query, headers)
    with pytest.raises(S3Error) as refused:
        sigv4.verify(unsigned_hash, sigv4.parse(unsigned_hash), SECRET)
    assert refused.value.code == "AccessDenied"
