"""What a task is, which tasks may share one upstream call, and how one call's answer is cut
back into each task's own result. Pure functions: no I/O
(tests/scheduler/batcher/test_batcher_payloads).

- Embeddings and completions batch into ONE upstream call: the tasks' ``input`` (``prompt``)
  items are concatenated, each task keeping its offset and count. They may share a call
  only when every other member of their bodies is the same: the compatibility key is the
  SHA-256 of the body without ``model`` and the input.
- Chat tasks batch as concurrent calls, one per (distinct) task.
- Deterministic payloads (embeddings always; completions and chat at temperature 0) are
  identified by the SHA-256 of their use case and canonical form: identical ones of one use
  case in a batch run once. Never across use cases: a task is computed, checked and billed
  for the use case that asked, and another tenant's copy must not reveal it was shared.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.async_tasks import layout
from gateway.costs import max_tokens_override

EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
SYNC_ENDPOINTS = frozenset(layout.ENDPOINTS.values())
# The member holding a batchable endpoint's inputs.
INPUT_MEMBER = {EMBEDDINGS: "input", COMPLETIONS: "prompt"}
# Members that do not change an answer (the cache and collapsing ignore them) or that the
# batcher sets itself (results are whole JSON bodies: never streamed).
_NOT_IN_ANSWER = ("model", "user", "stream", "stream_options", "metadata", "store")
_NOT_SENT = ("stream", "stream_options")


class MalformedTask(ValueError):
    """An entry that cannot be run as written (not by the contract): fails at once.
    ``task`` is what could be read of it (None without even a task id)."""

    def __init__(self, message: str, task: Task | None = None) -> None:
        super().__init__(message)
        self.task = task


@dataclass(slots=True, eq=False)
class Task:
    """One stream entry, as read; ``fields`` is the entry itself (what a dead letter keeps)."""

    entry_id: str
    stream: str
    task_id: str
    endpoint: str
    model: str
    use_case_id: str
    tenant: str
    priority_class: str
    estimate: int
    created_ms: int
    deadline_ms: int
    expires_ms: int
    callback_url: str
    body: dict[str, Any]
    fields: dict[str, str]
    attempts: int = 0
    buffered: bool = False  # waiting in a buffer now
    read_ms: float = 0.0  # when this batcher took it (wall-clock ms), or took it back to retry
    buffer_key: tuple[str, str, str, str] = ("", "", "", "")
    payload_sha: str = ""  # set for deterministic payloads only
    deterministic: bool = False

    def past_due(self, now_ms: int) -> bool:
        return (0 < self.deadline_ms <= now_ms) or (0 < self.expires_ms <= now_ms)


def _int(fields: dict[str, str], name: str) -> int:
    try:
        return int(fields.get(name) or 0)
    except ValueError:
        raise MalformedTask(f"entry field {name!r} is not an integer") from None


def parse_entry(stream: str, entry_id: str, raw: dict[bytes, bytes] | dict[str, str]) -> Task:
    """A stream entry (ENTRY_FIELDS) as a Task; MalformedTask when it cannot run."""
    fields = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }
    task_id = fields.get("task", "")
    if not task_id:
        raise MalformedTask("entry has no task id")
    task = Task(
        entry_id=entry_id,
        stream=stream,
        task_id=task_id,
        endpoint=fields.get("endpoint", ""),
        model=fields.get("model", ""),
        use_case_id=fields.get("use_case_id", ""),
        tenant=fields.get("tenant", ""),
        priority_class=fields.get("priority_class", ""),
        estimate=0,
        created_ms=0,
        deadline_ms=0,
        expires_ms=0,
        callback_url=fields.get("callback_url", ""),
        body={},
        fields=fields,
    )
    try:
        task.estimate = max(_int(fields, "estimate"), 1)
        task.created_ms = _int(fields, "created_ms")
        task.deadline_ms = _int(fields, "deadline_ms")
        task.expires_ms = _int(fields, "expires_ms")
        if task.endpoint not in SYNC_ENDPOINTS:
            raise MalformedTask(f"endpoint {task.endpoint!r} is not one the batcher runs")
        try:
            body = orjson.loads(fields.get("body", ""))
        except orjson.JSONDecodeError:
            raise MalformedTask("the task's body is not JSON") from None
        if not isinstance(body, dict):
            raise MalformedTask("the task's body is not a JSON object")
        task.body = body
        member = INPUT_MEMBER.get(task.endpoint)
        if member is not None:
            input_items(body.get(member))  # raises on a shape vLLM would refuse
    except MalformedTask as exc:
        raise MalformedTask(str(exc), task) from None
    task.deterministic = is_deterministic(task.endpoint, body)
    if task.deterministic:
        task.payload_sha = payload_sha256(task.use_case_id, task.model, task.endpoint, body)
    task.buffer_key = (task.model, task.endpoint, task.priority_class, compat_key(task))
    return task


def _canonical(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def is_deterministic(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether identical payloads must give identical answers: embeddings, or greedy decoding."""
    if endpoint == EMBEDDINGS:
        return True
    temperature = body.get("temperature")
    return (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and (temperature == 0)
    )


def payload_sha256(use_case_id: str, model: str, endpoint: str, body: dict[str, Any]) -> str:
    """The key collapsing and the result cache use: the use case (nothing is shared across
    use cases) + model + endpoint + the body's members that change the answer, as sorted
    JSON."""
    kept = {k: v for k, v in body.items() if k not in _NOT_IN_ANSWER}
    return hashlib.sha256(_canonical([use_case_id, model, endpoint, kept])).hexdigest()


def compat_key(task: Task) -> str:
    """Tasks with equal keys may share one upstream call (chat: one batch of calls)."""
    member = INPUT_MEMBER.get(task.endpoint)
    if member is None:
        return ""
    rest = {k: v for k, v in task.body.items() if k not in ("model", member, *_NOT_SENT)}
    return hashlib.sha256(_canonical(rest)).hexdigest()[:32]


def input_items(value: object) -> list[object]:
    """A task's ``input``/``prompt`` as the list of items it adds to a batch: a string or a
    list of token ids is one item; a list of strings (or of token-id lists) is many."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [value]
        if all(isinstance(v, str) for v in value) or all(
            isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value
        ):
            return list(value)
    raise MalformedTask("input must be a string, a list of strings, or token ids")


def item_weight(item: object) -> int:
    """An item's share of the batch's prompt tokens: its length, at least 1."""
    return max(len(item) if isinstance(item, str | list) else 1, 1)


def split(total: int, weights: list[int]) -> list[int]:
    """``total`` shared in proportion to ``weights``, in integers that add up to it."""
    whole = sum(weights)
    if not weights:
        return []
    if whole <= 0:
        weights, whole = [1] * len(weights), len(weights)
    exact = [total * w / whole for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - parts[i], reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


@dataclass(slots=True)
class BatchCall:
    """One upstream call: its body (without ``priority``, added at the grant) and, per task
    of the call, the (offset, count) of its items."""

    body: dict[str, Any]
    spans: list[tuple[int, int]]
    weights: list[list[int]]


def upstream_document(task: Task, served_name: str, max_tokens: int | None) -> dict[str, Any]:
    """A task's body as a replica gets it (less the priority): the served name, the model's
    completion bound, no streaming."""
    document = {k: v for k, v in task.body.items() if k not in _NOT_SENT}
    bound = max_tokens_override(task.endpoint, document, max_tokens)
    if bound is not None:
        document[bound[0]] = bound[1]
    document["model"] = served_name
    return document


def batch_call(tasks: list[Task], served_name: str, max_tokens: int | None) -> BatchCall:
    """The one call that runs ``tasks`` (compatible, of a batchable endpoint)."""
    endpoint = tasks[0].endpoint
    member = INPUT_MEMBER[endpoint]
    items: list[object] = []
    spans: list[tuple[int, int]] = []
    weights: list[list[int]] = []
    for task in tasks:
        mine = input_items(task.body.get(member))
        spans.append((len(items), len(mine)))
        weights.append([item_weight(item) for item in mine])
        items.extend(mine)
    document = upstream_document(tasks[0], served_name, max_tokens)
    document[member] = items
    return BatchCall(document, spans, weights)


def _usage(response: dict[str, Any]) -> dict[str, Any]:
    usage = response.get("usage")
    return usage if isinstance(usage, dict) else {}


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def slice_results(endpoint: str, response: dict[str, Any], call: BatchCall) -> list[dict[str, Any]]:
    """Each task's own answer from the batch's: its items re-indexed from 0, its share of the
    usage (prompt tokens by its inputs' length; completion tokens by its choices' text)."""
    usage = _usage(response)
    batch_weights = [sum(w) for w in call.weights]
    prompts = split(_count(usage, "prompt_tokens"), batch_weights)
    results: list[dict[str, Any]] = []
    if endpoint == EMBEDDINGS:
        data = response.get("data")
        items = data if isinstance(data, list) else []
        by_index = {item.get("index"): item for item in items if isinstance(item, dict)}
        for (offset, count), prompt in zip(call.spans, prompts, strict=True):
            mine = [
                {**by_index[offset + i], "index": i} for i in range(count) if offset + i in by_index
            ]
            result = {**response, "data": mine}
            result["usage"] = {**usage, "prompt_tokens": prompt, "total_tokens": prompt}
            results.append(result)
        return results
    n = call.body.get("n")
    per_prompt = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    raw_choices = response.get("choices")
    choices = (
        [c for c in raw_choices if isinstance(c, dict)] if isinstance(raw_choices, list) else []
    )
    mine_all: list[list[dict[str, Any]]] = []
    for offset, count in call.spans:
        low, high = offset * per_prompt, (offset + count) * per_prompt
        picked = sorted(
            (c for c in choices if isinstance(c.get("index"), int) and low <= c["index"] < high),
            key=lambda c: c["index"],
        )
        mine_all.append([{**c, "index": c["index"] - low} for c in picked])
    text_weights = [sum(len(str(c.get("text") or "")) for c in mine) or 1 for mine in mine_all]
    completions = split(_count(usage, "completion_tokens"), text_weights)
    for mine, prompt, completion in zip(mine_all, prompts, completions, strict=True):
        result = {**response, "choices": mine}
        result["usage"] = {
            **usage,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        results.append(result)
    return results


def tokens_of(result: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens a result says it used."""
    usage = _usage(result)
    return _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
