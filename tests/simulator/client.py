"""A byte-exact HTTP client for contract tests: stdlib http.client, nothing normalised away."""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body)

    def events(self) -> list[str]:
        """The ``data:`` payloads of an SSE body, after checking vLLM's framing."""
        text = self.body.decode()
        assert text.endswith("\n\n"), "every SSE event ends with a blank line"
        frames = text[:-2].split("\n\n")
        assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
        return [f[len("data: ") :] for f in frames]

    def chunks(self) -> list[dict[str, Any]]:
        events = self.events()
        assert events[-1] == "[DONE]"
        return [jsonlib.loads(e) for e in events[:-1]]


def connect(base_url: str, timeout: float = 30) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)


def call(
    base_url: str,
    method: str,
    path: str,
    json: Any = None,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    send_headers = dict(headers or {})
    if json is not None:
        body = jsonlib.dumps(json).encode()
        send_headers.setdefault("Content-Type", "application/json")
    conn = connect(base_url, timeout)
    try:
        conn.request(method, path, body=body, headers=send_headers)
        response = conn.getresponse()
        data = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


def post(base_url: str, path: str, json: Any, **kwargs: Any) -> Reply:
    return call(base_url, "POST", path, json, **kwargs)


def get(base_url: str, path: str, **kwargs: Any) -> Reply:
    return call(base_url, "GET", path, **kwargs)


def multipart(
    fields: dict[str, str], files: dict[str, tuple[str, bytes, str]]
) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type."""
    boundary = uuid.uuid4().hex
    out = bytearray()
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        out += value.encode() + b"\r\n"
    for name, (filename, data, content_type) in files.items():
        out += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: {content_type}\r\n\r\n'
        ).encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


class OpenStream:
    """A streaming request whose response is read piecemeal and can be abandoned."""

    def __init__(self, base_url: str, path: str, json: Any, timeout: float = 30) -> None:
        self.conn = connect(base_url, timeout)
        self.conn.request(
            "POST",
            path,
            body=jsonlib.dumps(json).encode(),
            headers={"Content-Type": "application/json"},
        )
        self.response = self.conn.getresponse()

    def read_event(self) -> str:
        """The next ``data:`` payload."""
        line = self.response.readline().decode()
        assert line.startswith("data: "), line
        assert self.response.readline() == b"\n"
        return line[len("data: ") :].rstrip("\n")

    def abandon(self) -> None:
        """Drop the connection the way a client that gave up does."""
        sock = self.conn.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()
