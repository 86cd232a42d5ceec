"""Which tasks share a call and how one answer is cut back into each task's result
(scheduler/batcher/payloads.py): pure functions, no processes."""

from __future__ import annotations

import orjson
import pytest

from gateway.async_tasks import layout
from scheduler.batcher.payloads import (
    MalformedTask,
    Task,
    batch_call,
    input_items,
    parse_entry,
    slice_results,
    split,
)


def entry(
    endpoint: str, body: dict[str, object], task: str = "task_1", use_case_id: str = "7"
) -> Task:
    fields: dict[str, str | bytes] = {
        "task": task, "endpoint": endpoint, "model": "m", "use_case_id": use_case_id,
        "tenant": "acme",
        "priority_class": "async", "estimate": "12", "created_ms": "1000", "deadline_ms": "0",
        "expires_ms": "9000", "callback_url": "", "body": orjson.dumps({"model": "m", **body}),
    }  # fmt: skip
    assert set(fields) == set(layout.ENTRY_FIELDS)
    return parse_entry("stream", "1-0", {k.encode(): v if isinstance(v, bytes) else v.encode()
                                          for k, v in fields.items()})  # fmt: skip


def test_input_items_keep_token_lists_whole() -> None:
    assert input_items("a") == ["a"]
    assert input_items(["a", "b"]) == ["a", "b"]
    assert input_items([1, 2, 3]) == [[1, 2, 3]]
    assert input_items([[1, 2], [3]]) == [[1, 2], [3]]
    bad: object
    for bad in ([], [1, "a"], 3, None, [[]]):
        with pytest.raises(MalformedTask):
            input_items(bad)


def test_tasks_differing_only_in_input_share_a_compatibility_key() -> None:
    a = entry("/v1/embeddings", {"input": "x", "dimensions": 8})
    b = entry("/v1/embeddings", {"input": ["y", "z"], "dimensions": 8})
    c = entry("/v1/embeddings", {"input": "x", "dimensions": 16})
    assert a.buffer_key == b.buffer_key != c.buffer_key


def test_identical_payloads_hash_alike_whatever_the_user_or_member_order() -> None:
    a = entry("/v1/completions", {"prompt": "p", "temperature": 0, "max_tokens": 3})
    b = entry("/v1/completions", {"max_tokens": 3, "temperature": 0, "prompt": "p", "user": "u"})
    warm = entry("/v1/completions", {"prompt": "p", "temperature": 0.7, "max_tokens": 3})
    assert a.deterministic
    assert b.deterministic
    assert not warm.deterministic
    assert a.payload_sha == b.payload_sha
    assert warm.payload_sha == ""


def test_identical_payloads_of_two_use_cases_never_hash_alike() -> None:
    """Collapsing and the result cache share an answer only within the use case that asked."""
    body: dict[str, object] = {"input": "the same words"}
    mine = entry("/v1/embeddings", body, use_case_id="7")
    again = entry("/v1/embeddings", body, task="task_2", use_case_id="7")
    theirs = entry("/v1/embeddings", body, task="task_3", use_case_id="8")
    assert mine.payload_sha == again.payload_sha != theirs.payload_sha


def test_a_malformed_entry_says_which_task_it_was() -> None:
    with pytest.raises(MalformedTask) as raised:
        entry("/v1/embeddings", {"input": 42})
    assert raised.value.task is not None
    assert raised.value.task.task_id == "task_1"
    with pytest.raises(MalformedTask):
        entry("/v1/images", {"prompt": "x"})


def test_embeddings_are_sliced_back_per_task_and_reindexed() -> None:
    tasks = [
        entry("/v1/embeddings", {"input": "aa"}),
        entry("/v1/embeddings", {"input": ["bbbb", "cc"]}),
    ]
    call = batch_call(tasks, "served", None)
    assert call.body["input"] == ["aa", "bbbb", "cc"]
    assert call.body["model"] == "served"
    response = {
        "object": "list",
        "data": [{"index": i, "embedding": [float(i)]} for i in range(3)],
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }
    first, second = slice_results("/v1/embeddings", response, call)
    assert first["data"] == [{"index": 0, "embedding": [0.0]}]
    assert second["data"] == [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [2.0]}]
    assert first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"] == 8
    assert second["usage"]["prompt_tokens"] == 6


def test_completions_choices_follow_n_per_prompt() -> None:
    tasks = [
        entry("/v1/completions", {"prompt": "one", "n": 2}),
        entry("/v1/completions", {"prompt": ["two", "three"], "n": 2}),
    ]
    call = batch_call(tasks, "m", 100)
    choices = [{"index": i, "text": "x" * (i + 1)} for i in range(6)]
    response = {"choices": choices, "usage": {"prompt_tokens": 9, "completion_tokens": 21}}
    first, second = slice_results("/v1/completions", response, call)
    assert [c["index"] for c in first["choices"]] == [0, 1]
    assert [c["text"] for c in second["choices"]] == ["xxx", "xxxx", "xxxxx", "xxxxxx"]
    assert [c["index"] for c in second["choices"]] == [0, 1, 2, 3]
    assert first["usage"]["completion_tokens"] + second["usage"]["completion_tokens"] == 21
    assert first["usage"]["total_tokens"] == (
        first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    )


def test_split_keeps_the_total() -> None:
    assert split(10, [1, 1, 1]) == [4, 3, 3]
    assert split(0, [5, 5]) == [0, 0]
    assert split(7, [0, 0]) == [4, 3]
    assert sum(split(1001, [3, 7, 11, 13])) == 1001
