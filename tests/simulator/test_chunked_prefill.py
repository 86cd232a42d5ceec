"""Chunked prefill (vLLM V1's default): a long prompt is prefilled over several steps within a
token budget, interleaved with the batch's decodes, instead of in one step that stalls it.

All in virtual time: the engine's simulated clock and its step record, never wall time.
"""

from __future__ import annotations

import asyncio

import pytest

from simulator.config import SimulatorConfig, parse_args
from simulator.engine import Engine, Sequence, Status
from simulator.metrics import SimulatorMetrics
from tests.simulator.virtual import make_engine, metric, run_until_done, seq, step

# The overload benchmark's replica: 20,000 prefill tokens/s, 8 ms a decode step.
RATE = 20_000.0
STEP_MS = 8.0
THINKER = 28_000


def status(s: Sequence) -> Status:
    """Read through a call, so that type checkers do not assume it cannot change."""
    return s.status


def gaps_next_to_a_long_prefill(**settings: bool | int) -> tuple[list[float], Sequence]:
    """A short request decoding alone, then a 28,000-token prompt arrives: the short one's
    gaps between tokens until the long one has its first token, and the long one."""
    engine = make_engine(
        prefill_tokens_per_s=RATE,
        decode_step_ms=STEP_MS,
        decode_step_ms_per_seq=0,
        max_model_len=32_768,
        **settings,
    )
    short = seq(prompt=40, tokens=1000)
    engine.submit(short)
    step(engine, 3)
    long = seq(prompt=THINKER, tokens=4)
    engine.submit(long)
    gaps = []

    async def run() -> None:
        while long.first_token_at is None:
            before = short.last_token_at
            await engine.step()
            gaps.append(short.last_token_at - before)

    asyncio.run(run())
    return gaps, long


def test_without_chunking_a_long_prompt_stalls_a_short_requests_decode_for_its_whole_prefill() -> (
    None
):
    gaps, long = gaps_next_to_a_long_prefill(enable_chunked_prefill=False)

    # One step: the whole prompt, then the decode step that samples both.
    assert gaps == [pytest.approx(THINKER / RATE + STEP_MS / 1000)]  # 1.408 s
    assert long.first_token_at is not None
    assert long.first_token_at - long.arrival == pytest.approx(1.408)


def test_with_chunking_the_short_request_gets_a_token_every_budget_sized_step() -> None:
    gaps, long = gaps_next_to_a_long_prefill(max_num_batched_tokens=8192)

    # Each step: the short one's decode (1 token of the budget) and 8,191 prompt tokens,
    # so 28,000 tokens take 4 steps (3 × 8,191 + 3,427) and the short one decodes in each.
    chunk_step = 8191 / RATE + STEP_MS / 1000
    assert gaps == [
        pytest.approx(chunk_step),
        pytest.approx(chunk_step),
        pytest.approx(chunk_step),
        pytest.approx((THINKER - 3 * 8191) / RATE + STEP_MS / 1000),
    ]
    assert max(gaps) < 0.42  # against 1.408 s in one step
    # The long prompt pays one decode step per chunk on top of its prefill.
    assert long.first_token_at is not None
    assert long.first_token_at - long.arrival == pytest.approx(THINKER / RATE + 4 * 0.008)


def test_a_smaller_budget_makes_shorter_steps() -> None:
    gaps, _ = gaps_next_to_a_long_prefill(max_num_batched_tokens=2048)

    assert max(gaps) == pytest.approx(2047 / RATE + STEP_MS / 1000)
    assert len(gaps) == -(-THINKER // 2047)  # ceil: 14 steps


def test_each_step_gives_the_decodes_their_token_first_and_the_rest_of_the_budget_to_prefill() -> (
    None
):
    engine = make_engine(max_num_batched_tokens=1000, max_num_seqs=8, max_model_len=8192)
    decoding = [seq(prompt=10, tokens=100) for _ in range(3)]
    for s in decoding:
        engine.submit(s)
    step(engine)
    long = seq(prompt=2500, tokens=5)
    engine.submit(long)

    records = []
    for _ in range(3):
        step(engine)
        records.append(engine.last_step)

    assert [(r.decodes, r.prefill_tokens, r.sampled) for r in records] == [
        (3, 997, 3),
        (3, 997, 3),
        (3, 506, 4),  # the last chunk; the long prompt samples its first token
    ]
    assert long.generated == 1
    assert all(s.generated == 4 for s in decoding)


def test_a_prompt_waiting_behind_a_long_prefill_gets_what_its_last_chunk_leaves() -> None:
    engine = make_engine(max_num_batched_tokens=1000, max_model_len=8192)
    long, short = seq(prompt=1500, tokens=5), seq(prompt=100, tokens=5)
    engine.submit(long)
    step(engine)  # 1,000 of the long prompt
    engine.submit(short)

    step(engine)  # the long prompt's last 500 first, then the short one fits in the rest

    assert engine.last_step.prefill_tokens == 600
    assert (long.generated, short.generated) == (1, 1)


def test_a_waiting_prompt_is_not_admitted_while_a_running_prefill_takes_the_whole_budget() -> None:
    engine = make_engine(max_num_batched_tokens=1000, max_model_len=8192)
    long, short = seq(prompt=3000, tokens=5), seq(prompt=100, tokens=5)
    engine.submit(long)
    step(engine)
    engine.submit(short)

    step(engine)

    # As in vLLM V1, running requests are scheduled before waiting ones.
    assert status(short) is Status.WAITING
    assert engine.num_waiting == 1


def test_a_partly_prefilled_prompt_counts_as_running_but_has_no_first_token_yet() -> None:
    engine = make_engine(max_num_batched_tokens=1000, max_model_len=8192)
    long = seq(prompt=2500, tokens=2)
    engine.submit(long)

    step(engine)

    assert metric(engine, "vllm:num_requests_running") == 1
    assert metric(engine, "vllm:num_requests_waiting") == 0
    assert metric(engine, "vllm:time_to_first_token_seconds_count") == 0
    assert metric(engine, "vllm:prompt_tokens_total") == 0
    assert metric(engine, "vllm:generation_tokens_total") == 0
    # Its KV blocks are reserved for the whole prompt on admission.
    assert engine.kv_used == 2500

    step(engine, 2)

    assert long.generated == 1
    assert metric(engine, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(engine, "vllm:prompt_tokens_total") == 2500
    assert metric(engine, "vllm:generation_tokens_total") == 1


def test_aborting_a_partly_prefilled_prompt_frees_its_slot_and_kv() -> None:
    engine = make_engine(max_num_batched_tokens=1000, max_model_len=8192)
    long, other = seq(prompt=2500, tokens=2), seq(prompt=10, tokens=2)
    engine.submit(long)
    step(engine)
    engine.abort(long)
    engine.submit(other)

    run_until_done(engine, [other])

    assert long.finish_reason == "abort"
    assert long.first_token_at is None
    assert engine.kv_used == 0
    assert engine.num_running == 0


def test_a_prefix_cache_hit_shortens_the_chunked_prefill() -> None:
    engine = make_engine(max_num_batched_tokens=1000, max_model_len=8192, block_size=100)
    blocks = tuple(range(25))
    first = seq(prompt=2500, tokens=1, blocks=blocks)
    engine.submit(first)
    run_until_done(engine, [first])
    again = seq(prompt=2500, tokens=1, blocks=blocks)
    engine.submit(again)

    step(engine)

    # Only the last token is computed again (vLLM needs its logits).
    assert engine.last_step.prefill_tokens == 1
    assert again.generated == 1


def test_the_engine_loop_finishes_chunked_prompts_on_its_own() -> None:
    async def run() -> list[Sequence]:
        config = SimulatorConfig(time_scale=0, max_num_batched_tokens=512, max_model_len=4096)
        engine = Engine(config, SimulatorMetrics("sim-chat"))
        seqs = [seq(prompt=p, tokens=3) for p in (3000, 20, 1500, 700)]
        for s in seqs:
            engine.submit(s)
        await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs)), 10)
        await engine.close()
        return seqs

    seqs = asyncio.run(run())
    assert all(s.finish_reason == "length" and s.generated == 3 for s in seqs)


def test_chunked_prefill_is_on_by_default_with_vllms_h100_budget() -> None:
    config = parse_args([])
    assert config.enable_chunked_prefill is True
    assert config.max_num_batched_tokens == 8192


def test_the_old_model_is_kept_behind_vllms_flag() -> None:
    config = parse_args(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"])
    assert config.enable_chunked_prefill is False
    assert config.max_num_batched_tokens == 4096


def test_a_budget_smaller_than_the_batch_is_refused_like_vllm_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--max-num-seqs", "256", "--max-num-batched-tokens", "100"])
    assert "max_num_batched_tokens (100) must be >= max_num_seqs (256)" in capsys.readouterr().err
    # Without chunking the budget is not used, so nothing to refuse.
    assert not parse_args(
        ["--no-enable-chunked-prefill", "--max-num-seqs", "256", "--max-num-batched-tokens", "100"]
    ).enable_chunked_prefill


def test_a_short_request_running_beside_a_whole_long_prefill_still_pays_for_it() -> None:
    """Chunking spreads the stall, it does not remove it: every step pays for the prompt
    tokens it carries (what docs/gateway-scheduling.md, "Long prompts", builds on)."""

    def short_latency(*, with_long: bool, chunked: bool) -> float:
        engine = make_engine(
            prefill_tokens_per_s=RATE,
            decode_step_ms=STEP_MS,
            decode_step_ms_per_seq=0,
            max_model_len=32_768,
            enable_chunked_prefill=chunked,
        )
        short = seq(prompt=40, tokens=64)
        engine.submit(short)
        if with_long:
            engine.submit(seq(prompt=THINKER, tokens=64))
        run_until_done(engine, [short])
        assert short.finished_at is not None
        return short.finished_at - short.arrival

    alone = short_latency(with_long=False, chunked=True)
    assert alone == pytest.approx(40 / RATE + 64 * STEP_MS / 1000)
    for chunked in (True, False):
        assert short_latency(with_long=True, chunked=chunked) == pytest.approx(
            alone + THINKER / RATE
        )


def test_a_partly_prefilled_prompt_preempted_for_kv_starts_its_prefill_over() -> None:
    engine = make_engine(
        kv_cache_tokens=3000, max_model_len=3000, max_num_seqs=2, max_num_batched_tokens=100
    )
    older, newer = seq(prompt=80, tokens=60), seq(prompt=2900, tokens=2)
    engine.submit(older)
    step(engine)
    engine.submit(newer)
    step(engine, 10)
    assert 0 < newer.prefill_left < 2900  # admitted, about a third prefilled

    step(engine, 15)  # the older one's growth no longer fits beside the newer one

    assert newer.preemptions == 1
    assert status(newer) is Status.WAITING
    assert newer.first_token_at is None
    run_until_done(engine, [older, newer])
    assert newer.generated == 2
    assert metric(engine, "vllm:num_preemptions_total") == 1
    assert metric(engine, "vllm:prompt_tokens_total") == 80 + 2900
    assert engine.kv_used == 0
