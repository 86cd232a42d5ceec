"""``multipart/form-data`` bodies into fields and files, with python-multipart's parser.

The same parser Starlette (and so vLLM) uses, so a body vLLM refuses is refused here too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header


class FormError(Exception):
    pass


@dataclass(slots=True)
class Upload:
    filename: str
    content_type: str
    data: bytes


@dataclass(slots=True)
class Form:
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, Upload] = field(default_factory=dict)


@dataclass(slots=True)
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    data: list[bytes] = field(default_factory=list)


def is_multipart(content_type: bytes | None) -> bool:
    media, _ = parse_options_header(content_type)
    return media == b"multipart/form-data"


def parse_form(content_type: bytes, body: bytes, max_parts: int = 100) -> Form:
    """Parse a whole multipart body; raises FormError for anything malformed."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise FormError("Missing boundary in multipart.")
    parts: list[_Part] = []
    header_field = bytearray()
    header_value = bytearray()

    def on_part_begin() -> None:
        if len(parts) >= max_parts:
            raise FormError(f"Too many parts. Maximum number of parts is {max_parts}.")
        parts.append(_Part())

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1].data.append(data[start:end])

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header_value.extend(data[start:end])

    def on_header_end() -> None:
        parts[-1].headers[bytes(header_field).lower()] = bytes(header_value)
        header_field.clear()
        header_value.clear()

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_part_data": on_part_data,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise FormError(str(exc)) from exc

    form = Form()
    for part in parts:
        disposition, options = parse_options_header(part.headers.get(b"content-disposition"))
        name = options.get(b"name")
        if disposition != b"form-data" or name is None:
            raise FormError('The Content-Disposition header field "name" must be provided.')
        key = name.decode("latin-1")
        data = b"".join(part.data)
        if b"filename" in options:
            form.files[key] = Upload(
                filename=options[b"filename"].decode("latin-1"),
                content_type=part.headers.get(b"content-type", b"").decode("latin-1"),
                data=data,
            )
        else:
            try:
                form.fields[key] = data.decode()
            except UnicodeDecodeError as exc:
                raise FormError(f"Field {key!r} is not valid UTF-8") from exc
    return form


def encode_form(form: Form) -> tuple[bytes, bytes]:
    """Encode a form as multipart/form-data; returns (content type, body).

    The gateway relays clients' bodies untouched; it re-encodes only when it must change a
    field (the public model id to the deployment's served name).
    """
    boundary = b"switchyard-" + secrets.token_hex(16).encode()
    chunks: list[bytes] = []
    for name, value in form.fields.items():
        chunks += [
            b"--" + boundary + b"\r\n",
            b'Content-Disposition: form-data; name="' + _quote(name) + b'"\r\n\r\n',
            value.encode(),
            b"\r\n",
        ]
    for name, upload in form.files.items():
        chunks += [
            b"--" + boundary + b"\r\n",
            b'Content-Disposition: form-data; name="'
            + _quote(name)
            + b'"; filename="'
            + _quote(upload.filename)
            + b'"\r\n',
            b"Content-Type: "
            + (upload.content_type or "application/octet-stream").encode()
            + b"\r\n\r\n",
            upload.data,
            b"\r\n",
        ]
    chunks.append(b"--" + boundary + b"--\r\n")
    return b"multipart/form-data; boundary=" + boundary, b"".join(chunks)


def _quote(value: str) -> bytes:
    # Quotes and line breaks cannot appear inside a quoted header parameter.
    return (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "").encode()
    )
