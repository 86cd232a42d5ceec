"""The batcher end to end: real Valkey, real simulator replicas, a real fleet watcher and real
batcher processes; tasks written into the streams by the contract (testkit/async_tasks).

Personas: acme's "search" use case submits embeddings; its "writer" use case completions and
chat.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any, cast

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import USAGE_STREAM
from gateway.async_tasks import layout
from governance.audit import Actor
from governance.dead_letters import dead_letter_replay, dead_letters_list
from governance.errors import NotFound
from ops.processes import free_port, wait_until
from testkit.async_tasks import depth, now_ms, status, submit, view, wait_ended
from testkit.policy import PolicyBuilder
from testkit.stack import RunningSimulator
from tests.conftest import BatcherFactory, SimulatorFactory

EMBED = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass
class World:
    client: valkey.Valkey
    embed: RunningSimulator
    chat: RunningSimulator
    search: int  # use case ids
    writer: int
    cached: int
    builder: PolicyBuilder

    def submit(self, endpoint: str, body: dict[str, object], **kw: object) -> str:
        model = self.embed.model if endpoint == EMBED else self.chat.model
        use_case = kw.pop("use_case_id", self.search if endpoint == EMBED else self.writer)
        return submit(
            self.client,
            model=model,
            endpoint=endpoint,
            body=body,
            use_case_id=use_case,  # type: ignore[arg-type]
            priority_class="async",
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture
def world(valkey_client: valkey.Valkey, start_simulator: SimulatorFactory) -> World:
    embed = start_simulator("embed", "--kind", "embedding", "--time-scale", "0")
    chat = start_simulator("chat", "--time-scale", "0")
    builder = PolicyBuilder()
    builder.model("embed", [embed.base_url], capabilities=("embeddings",))
    builder.model("chat", [chat.base_url])
    builder.priority_class("prod", rank=0).priority_class("async", rank=5, max_pool_share=0.5)
    search = builder.key(use_case="search", priority_class="prod")
    writer = builder.key(use_case="writer", priority_class="prod")
    cached = builder.key(use_case="cached", priority_class="prod")
    builder.use_case_limits(cached)
    builder.use_cases[str(builder.use_case_id(cached))]["async_tasks"] = {
        "result_ttl_s": 120,
        "cache_s": 60,
    }
    builder.publish(valkey_client)
    return World(
        valkey_client,
        embed,
        chat,
        builder.use_case_id(search),
        builder.use_case_id(writer),
        builder.use_case_id(cached),
        builder,
    )


def sim_metric(sim: RunningSimulator, name: str, **labels: str) -> float:
    """A simulator's /metrics sample (sum over the series matching ``labels``)."""
    text = httpx.get(f"{sim.base_url}/metrics", timeout=5).text
    return _sample(text, name, labels)


def _sample(text: str, name: str, labels: dict[str, str]) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def embedded_inputs(sim: RunningSimulator) -> float:
    """Inputs the embedding replica has pooled (each input is one finished sequence)."""
    return sim_metric(sim, "vllm:request_success_total", finished_reason="stop")


def usage_records(client: valkey.Valkey) -> list[dict[str, str]]:
    """Every record on the gateway's usage stream, as text."""
    entries = cast(list[Any], client.xrange(USAGE_STREAM))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def batcher_metric(port: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return _sample(text, name, labels)


def set_faults(sim: RunningSimulator, **faults: object) -> None:
    httpx.post(f"{sim.base_url}/sim/faults", json=faults, timeout=5).raise_for_status()


def direct_embedding(sim: RunningSimulator, text: str) -> list[float]:
    reply = httpx.post(
        f"{sim.base_url}/v1/embeddings", json={"model": sim.model, "input": text}, timeout=5
    )
    vector: list[float] = reply.json()["data"][0]["embedding"]
    return vector


def test_64_identical_embeddings_go_upstream_as_one_input(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN 64 identical embeddings tasks WHEN one batcher runs them THEN the replica pools
    one input, every task is done with the same vector, and all say collapsed."""
    ids = [world.submit(EMBED, {"input": "the same words"}) for _ in range(64)]
    before = embedded_inputs(world.embed)
    start_batcher()
    views = wait_ended(world.client, ids)
    assert {v["status"] for v in views} == {"done"}
    assert embedded_inputs(world.embed) - before == 1
    vectors = {orjson.dumps(v["result"]["data"][0]["embedding"]) for v in views}
    assert len(vectors) == 1
    assert all(v["collapsed"] == "1" for v in views)
    assert all(v["result"]["data"][0]["index"] == 0 for v in views)
    # Per the contract: ended tasks leave the stream and the depth.
    assert depth(world.client, "embed") == 0
    assert sum(cast(int, world.client.xlen(layout.stream("embed", p))) for p in range(2)) == 0


def test_a_full_batch_is_one_upstream_call_and_each_task_gets_its_own_slice(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a batch size of 6 and a window too long to matter WHEN six distinct tasks (one
    with a list input) arrive THEN one upstream call runs them, flushed full, and each task's
    data is its own inputs' vectors, re-indexed from 0, with its share of the usage."""
    port = free_port()
    batcher = start_batcher(
        SWITCHYARD_BATCHER_MAX_BATCH="6",
        SWITCHYARD_BATCHER_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_MIN_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_MAX_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_METRICS_PORT=str(port),
    )
    inputs: list[object] = [f"text number {i}" for i in range(4)]
    inputs.append(["first of a pair", "second of the pair, longer than the first"])
    ids = [world.submit(EMBED, {"input": value}) for value in inputs]
    # Five tasks (six inputs, but five tasks): not yet a full batch of six tasks.
    assert not wait_until(lambda: status(world.client, ids[0]) == "done", timeout=1.0)
    ids.append(world.submit(EMBED, {"input": "the sixth task"}))
    views = wait_ended(world.client, ids)
    assert {v["status"] for v in views} == {"done"}
    assert batcher_metric(port, "switchyard_batcher_upstream_calls_total", outcome="ok") == 1
    assert batcher_metric(port, "switchyard_batcher_flushes_total", reason="full") == 1
    assert batcher.alive()
    for view_, value in zip(views, [*inputs, "the sixth task"], strict=True):
        texts = value if isinstance(value, list) else [value]
        data = view_["result"]["data"]
        assert [item["index"] for item in data] == list(range(len(texts)))
        for item, text in zip(data, texts, strict=True):
            assert item["embedding"] == pytest.approx(direct_embedding(world.embed, text))
    usage = [v["result"]["usage"]["prompt_tokens"] for v in views]
    assert usage[4] > usage[0] > 0  # the pair's share is the larger


def test_a_partial_batch_flushes_when_its_window_passes(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN the default batch of 64 WHEN three tasks arrive THEN they do not wait for 61
    more: the window flushes them, in one call."""
    port = free_port()
    start_batcher(SWITCHYARD_BATCHER_METRICS_PORT=str(port))
    ids = [world.submit(EMBED, {"input": f"lonely {i}"}) for i in range(3)]
    views = wait_ended(world.client, ids)
    assert {v["status"] for v in views} == {"done"}
    assert batcher_metric(port, "switchyard_batcher_flushes_total", reason="window") >= 1
    assert batcher_metric(port, "switchyard_batcher_flushes_total", reason="full") == 0


def test_completions_batch_into_one_call_and_chat_runs_each(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN completions with identical parameters and two chat tasks WHEN run THEN the
    completions share one upstream call (choices re-indexed per task) and chat tasks get
    whole responses."""
    port = free_port()
    start_batcher(SWITCHYARD_BATCHER_METRICS_PORT=str(port))
    prompts = ["Once upon a time", "The weather today", "In a distant galaxy"]
    completions = [
        world.submit(COMPLETIONS, {"prompt": p, "max_tokens": 5, "temperature": 0.7})
        for p in prompts
    ]
    chats = [
        world.submit(CHAT, {"messages": [{"role": "user", "content": f"hello {i}"}]})
        for i in range(2)
    ]
    views = wait_ended(world.client, completions + chats)
    assert {v["status"] for v in views} == {"done"}
    for v in views[:3]:
        assert [c["index"] for c in v["result"]["choices"]] == [0]
        assert v["result"]["usage"]["completion_tokens"] > 0
    for v in views[3:]:
        assert v["result"]["object"] == "chat.completion"
    calls = batcher_metric(
        port, "switchyard_batcher_upstream_calls_total", endpoint=COMPLETIONS, outcome="ok"
    )
    assert calls == 1
    assert (
        batcher_metric(port, "switchyard_batcher_upstream_calls_total", endpoint=CHAT, outcome="ok")
        == 2
    )


def test_a_task_past_its_deadline_ends_expired_and_is_never_sent(
    world: World, start_batcher: BatcherFactory
) -> None:
    past = now_ms() - 1
    late = world.submit(EMBED, {"input": "too late"}, deadline_ms=past)
    stale = world.submit(EMBED, {"input": "queued too long"}, queue_ttl_s=0.001)
    before = embedded_inputs(world.embed)
    start_batcher()
    views = wait_ended(world.client, [late, stale])
    assert [v["status"] for v in views] == ["expired", "expired"]
    assert {v["error"]["code"] for v in views} == {"task_expired"}
    assert "result" not in views[0]
    assert embedded_inputs(world.embed) == before


def test_usage_records_are_written_per_task(world: World, start_batcher: BatcherFactory) -> None:
    """GIVEN two distinct tasks WHEN done THEN sy:usage has one record each, under the sync
    endpoint, with the task's use case and tokens."""
    start_batcher()
    ids = [world.submit(EMBED, {"input": f"count me {i}"}) for i in range(2)]
    wait_ended(world.client, ids)

    def records() -> dict[str, dict[str, str]]:
        return {record["request_id"]: record for record in usage_records(world.client)}

    assert wait_until(lambda: set(ids) <= set(records()), timeout=5)
    # The batchers' drain rate, what the gateway's Retry-After is computed from.
    assert wait_until(lambda: world.client.exists(layout.drain_rate("embed")) == 1, timeout=5)
    rate = cast(dict[bytes, bytes], world.client.hgetall(layout.drain_rate("embed")))
    assert float(rate[b"tasks_per_s"]) > 0
    assert abs(int(rate[b"at_ms"]) - now_ms()) < 60_000
    for task_id in ids:
        record = records()[task_id]
        assert record["endpoint"] == EMBED
        assert record["use_case_id"] == str(world.search)
        assert record["model"] == "embed"
        assert record["status"] == "200"
        assert int(record["prompt_tokens"]) > 0


def test_the_result_cache_answers_an_identical_task_later(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a use case with a result cache WHEN the same payload comes again after the first
    ended THEN the second is answered from the cache (collapsed) without a replica call."""
    start_batcher()
    first = world.submit(EMBED, {"input": "cache me"}, use_case_id=world.cached)
    (done,) = wait_ended(world.client, [first])
    assert done["status"] == "done"
    assert "collapsed" not in done
    before = embedded_inputs(world.embed)
    second = world.submit(EMBED, {"input": "cache me", "user": "someone"}, use_case_id=world.cached)
    (again,) = wait_ended(world.client, [second])
    assert again["status"] == "done"
    assert again["collapsed"] == "1"
    assert again["result"] == done["result"]
    assert embedded_inputs(world.embed) == before
    # Another use case does not read this one's cache.
    other = world.submit(EMBED, {"input": "cache me"})
    wait_ended(world.client, [other])
    assert embedded_inputs(world.embed) == before + 1


def test_a_bad_request_fails_at_once_with_the_upstream_error(
    world: World, start_batcher: BatcherFactory
) -> None:
    start_batcher()
    bad = world.submit(EMBED, {"input": "x", "dimensions": 100_000})
    (failed,) = wait_ended(world.client, [bad])
    assert failed["status"] == "failed"
    assert failed["status_code"] == "400"
    assert "dimensions" in failed["error"]["message"]
    assert failed["attempts"] == "0"
    assert "dead_lettered" not in failed
    assert world.client.xlen(layout.dead_letters()) == 0


def test_one_bad_input_in_a_batch_fails_only_its_own_task(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a batch where one task's input is longer than the model's context WHEN the
    replica refuses the batch (400) THEN each task is tried on its own: the long one fails
    with the replica's error, the others are done."""
    port = free_port()
    start_batcher(
        SWITCHYARD_BATCHER_MAX_BATCH="3",  # the three in one batch, whatever their timing
        SWITCHYARD_BATCHER_MIN_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_MAX_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_METRICS_PORT=str(port),
    )
    fine = [world.submit(EMBED, {"input": f"short {i}"}) for i in range(2)]
    too_long = world.submit(EMBED, {"input": [7] * 9000})  # token ids, counted exactly
    views = wait_ended(world.client, [*fine, too_long])
    assert [v["status"] for v in views] == ["done", "done", "failed"]
    assert views[2]["status_code"] == "400"
    assert "maximum context length" in views[2]["error"]["message"]
    assert "dead_lettered" not in views[2]
    calls = {
        outcome: batcher_metric(port, "switchyard_batcher_upstream_calls_total", outcome=outcome)
        for outcome in ("split", "ok", "refused_4xx")
    }
    assert calls == {"split": 1, "ok": 2, "refused_4xx": 2}  # the batch, then the long one


@pytest.mark.django_db  # the replay is audited
def test_three_failures_dead_letter_the_task_and_a_replay_runs_it(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a replica that answers 500 to everything WHEN a task runs THEN after three
    attempts it is failed, dead-lettered with its error; WHEN the replica recovers and an
    officer replays the letter THEN the same task id ends done."""
    set_faults(world.embed, error_rate=1.0)
    port = free_port()
    start_batcher(
        SWITCHYARD_BATCHER_RETRY_BACKOFF_MS="20", SWITCHYARD_BATCHER_METRICS_PORT=str(port)
    )
    task_id = world.submit(EMBED, {"input": "doomed at first"})
    (failed,) = wait_ended(world.client, [task_id])
    assert failed["status"] == "failed"
    assert failed["dead_lettered"] == "1"
    assert failed["attempts"] == str(layout.MAX_ATTEMPTS)
    assert failed["status_code"] == "500"
    (letter,) = dead_letters_list(user=None, count=10, client=world.client).letters
    assert letter.task_id == task_id
    assert letter.attempts == layout.MAX_ATTEMPTS
    assert letter.stream.startswith(layout.stream("embed", 0)[:-1])
    assert "fault" in letter.error.lower()
    assert depth(world.client, "embed") == 0

    set_faults(world.embed, error_rate=0.0)
    officer = Actor.system("test")
    replayed = dead_letter_replay(actor=officer, entry_id=letter.entry_id, client=world.client)
    assert replayed.letter.task_id == task_id
    assert world.client.xlen(layout.dead_letters()) == 0
    (done,) = wait_ended(world.client, [task_id])
    assert done["status"] == "done"
    assert done["attempts"] == "0"
    assert "dead_lettered" not in done
    with pytest.raises(NotFound):
        dead_letter_replay(actor=officer, entry_id=letter.entry_id, client=world.client)


def test_a_replica_that_hangs_times_out_each_attempt_then_dead_letters(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a model with a 1 s timeout and a replica that never answers WHEN a task runs
    THEN each attempt times out (504, upstream_timeout) and the third dead-letters it."""
    world.builder.models["embed"]["timeout_s"] = 1.0
    world.builder.publish(world.client)
    set_faults(world.embed, hang_rate=1.0)
    start_batcher(SWITCHYARD_BATCHER_RETRY_BACKOFF_MS="20")
    task_id = world.submit(EMBED, {"input": "never answered"})
    (failed,) = wait_ended(world.client, [task_id], timeout=30)
    assert failed["status"] == "failed"
    assert failed["status_code"] == "504"
    assert failed["error"]["code"] == "upstream_timeout"
    assert failed["dead_lettered"] == "1"
    assert failed["attempts"] == str(layout.MAX_ATTEMPTS)


def test_a_batcher_killed_mid_batch_loses_nothing(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a batcher whose batch is in flight (the replica is slow) WHEN it is killed with
    SIGKILL THEN a second batcher reclaims its pending entries after the claim timeout and
    every task ends done (at-least-once: the killed batch may have run twice upstream)."""
    set_faults(world.embed, slow_first_byte_ms=30_000)
    fast_claim = {"SWITCHYARD_BATCHER_CLAIM_IDLE_MS": "1000"}
    first = start_batcher(**fast_claim)
    ids = [world.submit(EMBED, {"input": f"survivor {i}"}) for i in range(10)]
    assert wait_until(
        lambda: all(view(world.client, t).get("status") == "running" for t in ids), timeout=10
    )
    first.signal(signal.SIGKILL)
    first.proc.wait(5)
    set_faults(world.embed, slow_first_byte_ms=0)
    second = start_batcher(**fast_claim)
    views = wait_ended(world.client, ids, timeout=30)
    assert {v["status"] for v in views} == {"done"}
    assert re.search(r"batcher_reclaimed stream=\S+ entries=\d+", second.log_text())
    # The attempt that died with the first batcher is counted.
    assert {v["attempts"] for v in views} == {"1"}
    assert depth(world.client, "embed") == 0
    pending = sum(
        cast(dict[str, int], world.client.xpending(layout.stream("embed", p), layout.GROUP))[
            "pending"
        ]
        for p in range(2)
    )
    assert pending == 0


def test_two_batchers_share_the_partitions_and_run_each_task_once(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN two batchers in the consumer group, each holding at most 20 tasks at a time
    WHEN 200 tasks arrive THEN both run some (no global lock), and every task ends done
    exactly once."""
    ports = [free_port(), free_port()]
    # The model's partitions known before the batchers start, and both reading every
    # partition before the work arrives: one that joined late could find it all taken.
    world.client.hsetnx(layout.partitions_registry(), world.embed.model, "2")
    for port in ports:
        start_batcher(SWITCHYARD_BATCHER_MAX_HELD="20", SWITCHYARD_BATCHER_METRICS_PORT=str(port))

    def both_reading() -> bool:
        streams = [layout.stream(world.embed.model, p) for p in range(2)]
        try:
            return all(
                len(cast(list[Any], world.client.xinfo_consumers(s, layout.GROUP))) == 2
                for s in streams
            )
        except valkey.ResponseError:  # the group not created yet
            return False

    assert wait_until(both_reading, timeout=10), "both batchers never joined every partition"
    ids = [world.submit(EMBED, {"input": f"shared work {i}"}) for i in range(200)]
    views = wait_ended(world.client, ids)
    assert {v["status"] for v in views} == {"done"}
    assert depth(world.client, "embed") == 0
    ended = [
        batcher_metric(port, "switchyard_batcher_tasks_ended_total", state="done") for port in ports
    ]
    assert all(count > 0 for count in ended), ended
    assert sum(ended) == 200
    assert wait_until(lambda: len(usage_records(world.client)) >= 200, timeout=5)
    usage = [record["request_id"] for record in usage_records(world.client)]
    assert sorted(usage) == sorted(ids)  # one record each: nothing ran twice


def test_an_entry_that_breaks_the_contract_fails_with_a_clear_error(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a stream entry whose body is not JSON WHEN read THEN its task fails at once with
    invalid_task, and is acknowledged (not retried, not dead-lettered)."""
    task_id = world.submit(EMBED, {"input": "fine"})
    stream = next(
        layout.stream("embed", p) for p in range(2) if world.client.xlen(layout.stream("embed", p))
    )
    ((entry_id, fields),) = cast(list[Any], world.client.xrange(stream))
    broken = {k.decode(): v for k, v in fields.items()}
    broken["body"] = b"{not json"
    world.client.xdel(stream, entry_id)
    world.client.xadd(stream, broken)
    start_batcher()
    (failed,) = wait_ended(world.client, [task_id])
    assert failed["status"] == "failed"
    assert failed["status_code"] == "400"
    assert failed["error"]["code"] == "invalid_task"
    assert "JSON" in failed["error"]["message"]
    assert world.client.xlen(layout.dead_letters()) == 0
    assert depth(world.client, "embed") == 0


def test_a_task_whose_attempts_keep_dying_is_dead_lettered(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN a task left running by two batchers that died (attempts 2) WHEN a third reads
    it THEN that counts its third interrupted attempt: dead-lettered, never run again."""
    task_id = world.submit(EMBED, {"input": "kills batchers"})
    world.client.hset(layout.task(task_id), mapping={"status": "running", "attempts": 2})
    before = embedded_inputs(world.embed)
    start_batcher()
    (failed,) = wait_ended(world.client, [task_id])
    assert failed["status"] == "failed"
    assert failed["dead_lettered"] == "1"
    assert failed["error"]["code"] == "batcher_interrupted"
    assert failed["attempts"] == "3"
    (letter,) = dead_letters_list(user=None, count=10, client=world.client).letters
    assert letter.task_id == task_id
    assert embedded_inputs(world.embed) == before


def test_a_batcher_stopped_gracefully_runs_what_it_buffered(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN tasks read into a buffer with a long window WHEN the batcher gets SIGTERM THEN
    it flushes them before it exits: they end done, none left pending."""
    batcher = start_batcher(
        SWITCHYARD_BATCHER_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_MIN_WINDOW_MS="20000",
        SWITCHYARD_BATCHER_MAX_WINDOW_MS="20000",
    )
    ids = [world.submit(EMBED, {"input": f"before the stop {i}"}) for i in range(3)]

    def pending() -> int:
        """Entries read and not yet acknowledged, over both partitions."""
        total = 0
        for p in range(2):
            try:
                reply = world.client.xpending(layout.stream("embed", p), layout.GROUP)
            except valkey.ResponseError:  # no such stream or group yet: nothing pending
                continue
            total += cast(dict[str, int], reply)["pending"]
        return total

    assert wait_until(lambda: pending() == 3, timeout=10)
    assert {status(world.client, t) for t in ids} == {"queued"}
    assert batcher.stop() == 0
    views = [view(world.client, t) for t in ids]
    assert {v["status"] for v in views} == {"done"}
    assert pending() == 0
