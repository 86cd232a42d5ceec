"""``scheduler.files.audited_downloads``' small hand-written parts, held to references.

The Range parser is proved against Werkzeug's (a maintained HTTP library, here through the
test dependencies) on generated headers: the same whole / partial / unsatisfiable answer and
the same bytes, but for three corner cases where RFC 9110 and Werkzeug part ways.
File names must never break the ``Content-Disposition`` header.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from werkzeug.http import parse_range_header

from scheduler.files.audited_downloads import (
    RangeNotSatisfiable,
    content_type_for,
    parse_range,
    safe_filename,
)

_number = st.one_of(st.just(""), st.integers(0, 3000).map(str))
_structured = st.builds(lambda a, b: f"bytes={a}-{b}", _number, _number)
_several = st.lists(_structured.map(lambda h: h.removeprefix("bytes=")), min_size=2, max_size=3)
_headers = st.one_of(
    _structured,
    _several.map(lambda parts: "bytes=" + ",".join(parts)),
    st.text(alphabet="bytes=-0123456789, ", max_size=20),
)


def _werkzeug(header: str, size: int) -> tuple[int, int] | str | None:
    # Two deliberate differences, where we follow RFC 9110 §14.1.1 and Werkzeug does not: a
    # zero-length suffix is unsatisfiable (Werkzeug ignores it), and a suffix longer than the
    # object means all of it (Werkzeug refuses it).
    suffix = re.fullmatch(r"bytes=-(\d+)", header.strip())
    if suffix and int(suffix[1]) == 0:
        return "unsatisfiable"
    if suffix and int(suffix[1]) > size:
        return 0, size - 1
    parsed = parse_range_header(header)
    if parsed is None or len(parsed.ranges) != 1:
        return None  # the whole object
    if parsed.units != "bytes":
        # RFC 9110 §14.2: a range unit the server does not know is ignored (Werkzeug parses
        # "=-1" as a range of unit "" and then calls it unsatisfiable).
        return None
    found = parsed.range_for_length(size)
    if found is None:
        return "unsatisfiable"
    return found[0], found[1] - 1


def _ours(header: str, size: int) -> tuple[int, int] | str | None:
    try:
        wanted = parse_range(header, size)
    except RangeNotSatisfiable:
        return "unsatisfiable"
    return None if wanted is None else (wanted.start, wanted.end)


@settings(max_examples=2000, deadline=None)
@given(header=_headers, size=st.integers(1, 2500))
@example(header="=-1", size=1)  # a unit that is not bytes: ignored
def test_the_range_parser_agrees_with_werkzeug(header: str, size: int) -> None:
    assert _ours(header, size) == _werkzeug(header, size)


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("call-0001.wav", "call-0001.wav"),
        ("Call 0001 (Zürich).wav", "Call_0001_Zurich.wav"),
        ('evil"; filename="x.exe\r\nSet-Cookie: a=b.txt', "evil_filename_x.exe_Set-Cookie_a_b.txt"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\me\\notes.pdf", "notes.pdf"),
        ("日本語.mp3", "mp3"),
        ("....", "download"),
    ],
)
def test_file_names_are_safe_in_a_header(name: str, safe: str) -> None:
    assert safe_filename(name) == safe


def test_content_types_come_from_the_name() -> None:
    assert content_type_for("a/b/CALL.WAV") == "audio/wav"
    assert content_type_for("x.mp3") == "audio/mpeg"
    assert content_type_for("x.pdf") == "application/pdf"
    assert content_type_for("out/results.jsonl") == "application/x-ndjson"
    assert content_type_for("out/t.vtt") == "text/vtt; charset=utf-8"
    assert content_type_for("out/t.json") == "application/json"
    assert content_type_for("out/t.txt") == "text/plain; charset=utf-8"
    assert content_type_for("noext") == "application/octet-stream"
