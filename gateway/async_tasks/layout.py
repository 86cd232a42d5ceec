"""The async task API's contract in Valkey (docs/async.md): what the gateway writes at
submit, what the batcher (scheduler/batcher/) reads, runs and answers, what pollers read.

One module, imported by both sides, so that neither spells a key or a field on its own.

A task's life::

    submit (gateway, submit.lua, one atomic call for 1..N tasks)
      limits counted, backlog bound checked, depth += N,
      XADD  stream(model, partition) {ENTRY_FIELDS}
      HSET  task(id) {status=queued, ...}  PEXPIRE queue_ttl
    batcher (consumer group GROUP on every partition stream of the models it serves)
      XREADGROUP → wait-or-full → status=running → one upstream call per batch
      → HSET result / error, status=done|failed|expired, PEXPIRE result_ttl
      → XACK + XDEL, depth -= 1, PUBLISH DONE_CHANNEL <task id>
      a failed attempt: attempts += 1; after MAX_ATTEMPTS the entry goes to DLQ_STREAM
      (status failed, dead_lettered=1); an entry idle in a dead batcher's pending list
      longer than its claim timeout is taken over (XAUTOCLAIM) and retried.
    poll (gateway): HGETALL task(id); ``?wait=`` waits on DONE_CHANNEL.

Every key carries the ``{sy}`` hash tag, as admission's do (gateway/scheduling/keys.py), so
that submit.lua may touch the limits, the depth and the streams in one call.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from gateway.scheduling.keys import KEY_PREFIX

# The async endpoints and the synchronous endpoint each one's tasks run as.
ENDPOINTS: Final = {
    "/v1/async/embeddings": "/v1/embeddings",
    "/v1/async/completions": "/v1/completions",
    "/v1/async/chat/completions": "/v1/chat/completions",
}
TASKS_PATH_PREFIX: Final = "/v1/tasks/"

TaskStatus = Literal["queued", "running", "done", "failed", "expired"]
TERMINAL: Final = frozenset({"done", "failed", "expired"})

GROUP: Final = "batchers"  # the consumer group on every partition stream
MAX_ATTEMPTS: Final = 3  # failed attempts before a task goes to the dead-letter stream
DONE_CHANNEL: Final = "sy:atq:done"  # pub/sub (not slot-bound): a task id per message

TASK_ID_PREFIX: Final = "task_"


def task(task_id: str, *, prefix: str = KEY_PREFIX) -> str:
    """The task's hash (TASK_FIELDS): status, owner, timings, result or error."""
    return f"{prefix}task:{task_id}"


def stream(model: str, partition: int, *, prefix: str = KEY_PREFIX) -> str:
    """One partition of a model's task stream: entries are ENTRY_FIELDS."""
    return f"{prefix}atq:{model}:{partition}"


def partition_of(task_id: str, partitions: int) -> int:
    """Which of a model's ``partitions`` streams a task goes to: stable, spread evenly."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % partitions


def depth(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """A counter: the model's tasks submitted and not yet ended (the backlog bound's)."""
    return f"{prefix}atq-depth:{model}"


def drain_rate(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """A hash written by the batchers: ``tasks_per_s`` (EWMA of tasks ended per second) and
    ``at_ms``; what the gateway's Retry-After for a full backlog is computed from."""
    return f"{prefix}atq-rate:{model}"


def dead_letters(*, prefix: str = KEY_PREFIX) -> str:
    """The dead-letter stream: ENTRY_FIELDS plus DEAD_LETTER_FIELDS, for officers to replay."""
    return f"{prefix}atq-dlq"


def result_cache(use_case_id: int | str, payload_sha256: str, *, prefix: str = KEY_PREFIX) -> str:
    """A cached result body for a use case's deterministic payload (its SHA-256)."""
    return f"{prefix}atq-cache:{use_case_id}:{payload_sha256}"


def partitions_registry(*, prefix: str = KEY_PREFIX) -> str:
    """A hash model → partition count, written at submit (HSETNX) so that batchers find
    every stream without scanning keys."""
    return f"{prefix}atq-models"


# A stream entry: everything the batcher needs to run the task without another read.
ENTRY_FIELDS: Final = (
    "task",  # task id
    "endpoint",  # the synchronous path it runs as, e.g. /v1/embeddings
    "model",  # public model id
    "use_case_id",
    "tenant",
    "priority_class",  # the class its upstream call is queued at (SWITCHYARD_ASYNC_PRIORITY_CLASS)
    "estimate",  # tokens, as admission estimated them at submit
    "created_ms",
    "deadline_ms",  # 0: none; past it the task ends "expired" and is not run
    "expires_ms",  # created + the queue TTL: past it, the same
    "callback_url",  # "" for none
    "body",  # the validated JSON body (request guardrails applied), "model" as submitted
)
DEAD_LETTER_FIELDS: Final = ("error", "attempts", "failed_ms", "stream")

# The task hash. Set at submit: status, use_case_id, tenant, model, endpoint, created_ms,
# deadline_ms, expires_ms, attempts (0), result_ttl_s. Later: started_ms, finished_ms,
# status_code (the upstream's HTTP status), result (the response body, JSON) or error (an
# OpenAI error object, JSON), collapsed ("1" when the result was shared with an identical
# task or came from the cache), dead_lettered ("1").
TASK_FIELDS: Final = (
    "status",
    "use_case_id",
    "tenant",
    "model",
    "endpoint",
    "created_ms",
    "deadline_ms",
    "expires_ms",
    "attempts",
    "result_ttl_s",
    "started_ms",
    "finished_ms",
    "status_code",
    "result",
    "error",
    "collapsed",
    "dead_lettered",
)
