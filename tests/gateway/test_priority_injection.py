"""The class's vLLM priority is spliced into the forwarded body, not re-serialised: whatever
the client's JSON looks like, the result is that object plus ``priority``, byte for byte
otherwise (end to end: test_priority_scheduling.test_a_class_vllm_priority_goes_upstream...)."""

from __future__ import annotations

import orjson
import pytest

from gateway.app import with_priority

BODIES = [
    b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    # Pretty-printed, with a trailing newline, as curl users send it.
    b'{\n  "model": "m",\n  "messages": [{"role": "user", "content": "hi"}]\n}\n',
    # Braces and quotes inside strings, and non-ASCII text.
    b'{"model":"m","prompt":"a } b \\" } {\\"k\\": 1}","note":"\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}',
    # Nested objects at the end.
    b'{"model":"m","stream_options":{"include_usage":true}}  ',
]


@pytest.mark.parametrize("body", BODIES)
def test_the_result_is_the_same_object_plus_the_priority(body: bytes) -> None:
    spliced = with_priority(body, 7)
    assert orjson.loads(spliced) == {**orjson.loads(body), "priority": 7}
    assert spliced.startswith(body.rstrip()[:-1])  # the client's bytes are kept as they were


def test_a_negative_priority_is_written_as_a_json_number() -> None:
    assert orjson.loads(with_priority(b'{"model":"m"}', -3))["priority"] == -3
