"""The continuous-batching engine, stepped by hand in virtual time."""

from __future__ import annotations

import asyncio

import pytest

from simulator.config import SimulatorConfig
from simulator.engine import Engine, Sequence, Status
from simulator.metrics import SimulatorMetrics
from tests.simulator.virtual import MODEL, make_engine, metric, run_until_done, seq, step


def status(s: Sequence) -> Status:
    """Read through a call, so that type checkers do not assume it cannot change."""
    return s.status


def test_the_batch_is_capped_at_max_num_seqs_and_the_rest_wait() -> None:
    engine = make_engine(max_num_seqs=2)
    seqs = [seq(tokens=50) for _ in range(5)]
    for s in seqs:
        engine.submit(s)
    assert metric(engine, "vllm:num_requests_waiting") == 5

    step(engine)

    assert [s.status for s in seqs] == [Status.RUNNING] * 2 + [Status.WAITING] * 3
    assert metric(engine, "vllm:num_requests_running") == 2
    assert metric(engine, "vllm:num_requests_waiting") == 3


def test_a_finished_sequence_makes_room_for_the_next_waiting_one() -> None:
    engine = make_engine(max_num_seqs=1)
    first, second = seq(tokens=3), seq(tokens=3)
    engine.submit(first)
    engine.submit(second)

    step(engine, 3)
    assert first.finished
    assert status(second) is Status.WAITING
    step(engine)
    assert status(second) is Status.RUNNING
    assert second.admitted_at == first.finished_at


def test_the_kv_cache_limits_admission_before_max_num_seqs_does() -> None:
    engine = make_engine(kv_cache_tokens=1000, max_model_len=500, max_num_seqs=10)
    seqs = [seq(prompt=400, tokens=5) for _ in range(3)]
    for s in seqs:
        engine.submit(s)

    step(engine)

    assert engine.num_running == 2
    assert engine.num_waiting == 1
    # Two prompts of 400 tokens plus one generated token each.
    assert metric(engine, "vllm:kv_cache_usage_perc") == pytest.approx(802 / 1000)


def test_the_head_of_the_queue_blocks_smaller_requests_behind_it() -> None:
    engine = make_engine(kv_cache_tokens=1000, max_model_len=1000)
    engine.submit(seq(prompt=600, tokens=100))
    step(engine)
    big, small = seq(prompt=500), seq(prompt=10)
    engine.submit(big)
    engine.submit(small)

    step(engine)

    # vLLM does not skip ahead: the small one would fit but waits behind the big one.
    assert (big.status, small.status) == (Status.WAITING, Status.WAITING)


def test_kv_growth_preempts_the_newest_sequence_which_resumes_later() -> None:
    engine = make_engine(kv_cache_tokens=100, max_model_len=100)
    older, newer = seq(prompt=40, tokens=30), seq(prompt=40, tokens=30)
    engine.submit(older)
    engine.submit(newer)

    run_until_done(engine, [older, newer])

    assert metric(engine, "vllm:num_preemptions_total") >= 1
    assert older.preemptions == 0
    assert newer.preemptions >= 1
    assert older.generated == newer.generated == 30
    assert older.finished_at is not None
    assert newer.finished_at is not None
    assert older.finished_at < newer.finished_at
    assert engine.kv_used == 0


def test_prefill_time_grows_with_prompt_length() -> None:
    def time_to_first_token(prompt: int) -> float:
        engine = make_engine(prefill_tokens_per_s=1000, decode_step_ms=10, decode_step_ms_per_seq=0)
        s = seq(prompt=prompt, tokens=1)
        engine.submit(s)
        run_until_done(engine, [s])
        assert s.first_token_at is not None
        return s.first_token_at - s.arrival

    # prompt / prefill rate, plus the decode step that samples the first token
    assert time_to_first_token(100) == pytest.approx(0.100 + 0.010)
    assert time_to_first_token(1000) == pytest.approx(1.000 + 0.010)


def test_the_decode_step_grows_with_the_batch() -> None:
    def inter_token_time(batch: int) -> float:
        engine = make_engine(
            prefill_tokens_per_s=1e12, decode_step_ms=10, decode_step_ms_per_seq=1.0
        )
        seqs = [seq(tokens=11) for _ in range(batch)]
        for s in seqs:
            engine.submit(s)
        run_until_done(engine, seqs)
        s = seqs[0]
        assert s.first_token_at is not None
        return (s.last_token_at - s.first_token_at) / 10

    assert inter_token_time(1) == pytest.approx(0.011)
    assert inter_token_time(10) == pytest.approx(0.020)
    assert inter_token_time(100) == pytest.approx(0.110)


def test_time_scale_zero_takes_no_simulated_time() -> None:
    engine = make_engine(time_scale=0)
    s = seq(prompt=5000, tokens=20)
    engine.submit(s)
    run_until_done(engine, [s])
    assert s.finished_at == 0.0


def _admission_order(policy: str) -> list[str]:
    engine = make_engine(max_num_seqs=1, scheduling_policy=policy)
    blocker = seq(tokens=2)
    engine.submit(blocker)
    step(engine)
    named = {
        name: seq(tokens=2, priority=p) for name, p in [("a", 5), ("b", 1), ("c", 3), ("d", 1)]
    }
    for s in named.values():
        engine.submit(s)
    run_until_done(engine, [blocker, *named.values()])
    return sorted(named, key=lambda name: named[name].admitted_at or 0.0)


def test_the_priority_policy_admits_the_lowest_value_first_ties_by_arrival() -> None:
    assert _admission_order("priority") == ["b", "d", "c", "a"]


def test_fcfs_admits_in_arrival_order_whatever_the_priority() -> None:
    assert _admission_order("fcfs") == ["a", "b", "c", "d"]


def test_the_priority_policy_preempts_the_least_urgent_running_sequence() -> None:
    engine = make_engine(kv_cache_tokens=100, max_model_len=100, scheduling_policy="priority")
    urgent_late = seq(prompt=40, tokens=30, priority=0)
    lazy_early = seq(prompt=40, tokens=30, priority=9)
    engine.submit(lazy_early)
    engine.submit(urgent_late)

    run_until_done(engine, [urgent_late, lazy_early])

    assert urgent_late.preemptions == 0
    assert lazy_early.preemptions >= 1


def test_aborting_a_running_sequence_frees_its_slot_and_kv_at_once() -> None:
    engine = make_engine(max_num_seqs=1)
    running, waiting = seq(prompt=100, tokens=1000), seq()
    engine.submit(running)
    engine.submit(waiting)
    step(engine)
    assert engine.kv_used == 101

    engine.abort(running)

    assert running.finish_reason == "abort"
    assert (engine.num_running, engine.kv_used) == (0, 0)
    assert metric(engine, "vllm:request_success_total", finished_reason="abort") == 1
    step(engine)
    assert waiting.status is Status.RUNNING


def test_aborting_a_waiting_sequence_removes_it_from_the_queue() -> None:
    engine = make_engine(max_num_seqs=1)
    running, gone, kept = seq(tokens=2), seq(tokens=2), seq(tokens=2)
    for s in (running, gone, kept):
        engine.submit(s)
    step(engine)

    engine.abort(gone)

    assert engine.num_waiting == 1
    run_until_done(engine, [running, kept])
    assert gone.admitted_at is None
    assert gone.generated == 0


def test_a_repeated_prefix_skips_its_prefill_and_counts_as_hits() -> None:
    engine = make_engine(prefill_tokens_per_s=1000, decode_step_ms=10, decode_step_ms_per_seq=0)
    blocks = tuple(range(10))  # ten full 16-token blocks: 160 tokens
    first, again = (
        seq(prompt=200, tokens=1, blocks=blocks),
        seq(prompt=200, tokens=1, blocks=blocks),
    )
    engine.submit(first)
    run_until_done(engine, [first])
    engine.submit(again)
    run_until_done(engine, [again])

    assert (first.cached_tokens, again.cached_tokens) == (0, 160)
    assert metric(engine, "vllm:prefix_cache_queries_total") == 400
    assert metric(engine, "vllm:prefix_cache_hits_total") == 160
    assert again.first_token_at is not None
    assert again.first_token_at - again.arrival == pytest.approx(0.040 + 0.010)


def test_a_different_prefix_gets_no_hits() -> None:
    engine = make_engine()
    first, other = seq(prompt=200, blocks=(1, 2, 3)), seq(prompt=200, blocks=(9, 2, 3))
    engine.submit(first)
    run_until_done(engine, [first])
    engine.submit(other)
    run_until_done(engine, [other])
    assert other.cached_tokens == 0


def test_a_finished_sequence_is_counted_by_reason_and_tokens() -> None:
    engine = make_engine()
    s = seq(prompt=10, tokens=5)
    s.target_reason = "stop"
    engine.submit(s)
    steps = run_until_done(engine, [s])

    assert (steps, s.generated, s.finish_reason) == (5, 5, "stop")
    assert metric(engine, "vllm:request_success_total", finished_reason="stop") == 1
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 0
    assert metric(engine, "vllm:generation_tokens_total") == 5
    assert metric(engine, "vllm:prompt_tokens_total") == 10
    assert metric(engine, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(engine, "vllm:inter_token_latency_seconds_count") == 4
    assert metric(engine, "vllm:e2e_request_latency_seconds_count") == 1
    assert metric(engine, "vllm:request_queue_time_seconds_count") == 1


def test_the_engine_loop_serves_many_concurrent_sequences_and_goes_idle() -> None:
    config = SimulatorConfig(served_model_names=(MODEL,), time_scale=0, max_num_seqs=64)
    engine = Engine(config, SimulatorMetrics(MODEL))

    async def scenario() -> None:
        seqs = [seq(prompt=20, tokens=4) for _ in range(500)]
        for s in seqs:
            engine.submit(s)
        await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs)), 10)
        assert all(s.finish_reason == "length" for s in seqs)
        await engine.close()

    asyncio.run(scenario())
    assert (engine.num_running, engine.num_waiting, engine.kv_used) == (0, 0, 0)
    assert metric(engine, "vllm:e2e_request_latency_seconds_count") == 500
