"""S3's errors, in S3's XML shape: every refusal of the endpoint is one of these."""

from __future__ import annotations

from xml.sax.saxutils import escape

# code → HTTP status, as S3 answers them
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "ConditionalRequestConflict": 409,
    "EntityTooLarge": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidRequest": 400,
    "MalformedXML": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "NotImplemented": 501,
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "XAmzContentSHA256Mismatch": 400,
}


class S3Error(Exception):
    """A refusal with S3's code; ``status`` follows the code unless given."""

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else STATUS.get(code, 400)


def error_xml(error: S3Error, *, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(error.code)}</Code><Message>{escape(error.message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{escape(request_id)}</RequestId>"
        "</Error>"
    ).encode()
