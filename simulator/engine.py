"""Continuous batching, as vLLM's scheduler does it, with simulated step times.

One engine task per process runs steps only while there is work. Each step:

1. if the running batch would outgrow the KV cache this step, preempts the newest
   (FCFS) or least urgent (priority) running sequence back to the waiting queue;
2. spends the step's token budget (``max_num_batched_tokens``, vLLM V1's chunked prefill):
   one token for each running sequence whose prompt is prefilled (its decode), then chunks
   of the prompts still being prefilled, oldest admission first, then admits waiting
   sequences, FCFS or lowest ``priority`` first, while the budget lasts, the batch has
   fewer than ``max_num_seqs`` and the KV cache has room for their prompt — stopping at the
   first that does not fit, as vLLM does (no skipping ahead). The last one admitted may get
   only a chunk of its prompt; it goes on in the next steps, interleaved with the decodes.
   With chunked prefill off there is no budget: an admitted prompt is prefilled whole in
   its first step, which stalls every decode of the batch meanwhile (the old model);
3. takes ``prefill tokens in the step / prefill_tokens_per_s`` plus ``decode_step_ms +
   decode_step_ms_per_seq × sequences that sample a token``, all times ``time_scale``;
4. emits one token for every decoding sequence and for each whose prefill finished in this
   step, so a sequence's time to first token includes its own prefill.

The engine only counts tokens; which words they are is the HTTP layer's business.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from simulator.config import SimulatorConfig
from simulator.metrics import SimulatorMetrics
from simulator.prefix_cache import PrefixCache

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        # sleep(0) still yields, so the HTTP side can run between steps even at time_scale 0.
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


class Status(Enum):
    NEW = "new"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    """One generation stream: a request's choice, as the scheduler sees it."""

    prompt_tokens: int
    target_tokens: int  # finishes after this many tokens...
    target_reason: str = "length"  # ...with this finish_reason
    priority: int = 0
    block_hashes: Seq[int] = ()
    stream: bool = False  # wake the consumer on every token, not only at the end
    pooling: bool = False  # embeddings: one forward pass, no generated tokens to count

    status: Status = Status.NEW
    generated: int = 0
    cached_tokens: int = 0  # prompt tokens served by the prefix cache on first admission
    prefill_left: int = 0  # tokens to compute before it samples again (0: decoding)
    preemptions: int = 0
    finish_reason: str | None = None
    arrival: float = 0.0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    finished_at: float | None = None
    _order: int = 0
    _chunk: int = 0  # prompt tokens prefilled for it in the step being run
    _waiter: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    async def wait_finished(self) -> None:
        while self.status is not Status.FINISHED:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            await waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


async def wait_until(seqs: Seq[Sequence], ready: Callable[[], bool]) -> None:
    """Until ``ready()`` holds, checked again whenever one of ``seqs`` makes progress.

    A stream wakes on every token, any sequence when it finishes. One future is shared by
    all the sequences: whichever moves first wakes the waiter.
    """
    loop = asyncio.get_running_loop()
    while not ready():
        waiter = loop.create_future()
        for seq in seqs:
            seq._waiter = waiter
        await waiter


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one engine step did and how long it took in simulated seconds (before
    ``time_scale``): tests and benchmarks read the timing model from it."""

    prefill_tokens: int  # prompt tokens computed in the step (chunks and whole prompts)
    decodes: int  # sequences that were already decoding and got their next token
    sampled: int  # sequences that got a token: the decodes plus prefills that finished
    seconds: float


IDLE_STEP = StepRecord(0, 0, 0, 0.0)


class Engine:
    def __init__(
        self,
        config: SimulatorConfig,
        metrics: SimulatorMetrics,
        clock: Clock | None = None,
        *,
        autostart: bool = True,
    ) -> None:
        """``autostart=False`` leaves stepping to the caller (``await engine.step()``)."""
        self.config = config
        self.metrics = metrics
        self.clock: Clock = clock or MonotonicClock()
        self.prefix_cache = PrefixCache(config.kv_cache_tokens // config.block_size)
        self._priority_policy = config.scheduling_policy == "priority"
        self._waiting: list[tuple[int, int, Sequence]] = []  # heap; aborted entries linger
        self._num_waiting = 0
        self._running: dict[Sequence, None] = {}  # insertion-ordered: admission order
        # Running, with prompt tokens still to prefill after their first step (chunked
        # prefill), in admission order: kept apart so a step of pure decodes costs no scan.
        self._partial: dict[Sequence, None] = {}
        self._just_prefilled: list[Sequence] = []
        self._chunked: list[Sequence] = []  # got a prompt chunk this step
        self._kv_used = 0
        self._order = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._autostart = autostart
        self.steps = 0
        self.last_step = IDLE_STEP
        metrics.bind_scheduler_state(
            lambda: len(self._running), lambda: self._num_waiting, self.kv_usage
        )

    # -- observation ---------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def kv_used(self) -> int:
        return self._kv_used

    def kv_usage(self) -> float:
        return self._kv_used / self.config.kv_cache_tokens

    # -- requests ------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        if seq.status is not Status.NEW:
            raise ValueError("a sequence can be submitted once")
        self._order += 1
        seq._order = self._order
        seq.arrival = self.clock.now()
        self._push_waiting(seq)
        self._ensure_running()
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """The client went away: free the slot and the KV cache at once."""
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            del self._running[seq]
            self._partial.pop(seq, None)
            self._kv_used -= seq.prompt_tokens + seq.generated
        elif seq.status is Status.WAITING:
            self._num_waiting -= 1  # its heap entry is skipped when it surfaces
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
        seq.finished_at = self.clock.now()
        self.metrics.request_success["abort"].inc()
        seq._wake()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                # Only swallow our own cancellation of the engine task, not the caller's.
                if not task.cancelled():
                    raise

    # -- the loop ------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._autostart and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def _run(self) -> None:
        while True:
            if not self._running and not self._num_waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stall every request in the process
                log.exception("simulator engine step failed")
                await asyncio.sleep(0.01)

    async def step(self) -> None:
        start = self.clock.now()
        seconds = self._schedule(start)
        await self.clock.sleep_until(start + seconds * self.config.time_scale)
        self._emit(self.clock.now())
        self.steps += 1

    def _schedule(self, now: float) -> float:
        """Preempt, spend the step's token budget and admit; returns the step's simulated
        duration in seconds."""
        c = self.config
        # Without chunked prefill there is no budget: the old model, one prompt in one step.
        budget = c.max_num_batched_tokens if c.enable_chunked_prefill else 1 << 62
        preempted = self._make_room()
        decodes = len(self._running) - len(self._partial)
        budget -= decodes
        prefill_tokens = 0
        chunked = self._chunked
        # Prompts admitted in earlier steps and not yet prefilled go on, oldest first.
        for seq in self._partial:
            if budget <= 0:
                break
            seq._chunk = min(seq.prefill_left, budget)
            budget -= seq._chunk
            prefill_tokens += seq._chunk
            chunked.append(seq)
        if not preempted and budget > 0:
            prefill_tokens += self._admit(now, budget)
        if not self._running:
            self.last_step = IDLE_STEP
            return 0.0
        sampled = decodes + sum(1 for seq in chunked if seq._chunk == seq.prefill_left)
        seconds = (
            prefill_tokens / c.prefill_tokens_per_s
            + (c.decode_step_ms + c.decode_step_ms_per_seq * sampled) / 1000.0
        )
        self.last_step = StepRecord(prefill_tokens, decodes, sampled, seconds)
        return seconds

    def _make_room(self) -> bool:
        """Preempt until every running sequence can store one more token's KV."""
        preempted = False
        while self._running and self._kv_used + len(self._running) > self.config.kv_cache_tokens:
            if self._priority_policy:
                victim = max(self._running, key=lambda s: (s.priority, s._order))
            else:
                victim = next(reversed(self._running))
            del self._running[victim]
            self._partial.pop(victim, None)
            self._kv_used -= victim.prompt_tokens + victim.generated
            victim.preemptions += 1
            self._push_waiting(victim)
            self.metrics.num_preemptions.inc()
            preempted = True
        return preempted

    def _admit(self, now: float, budget: int) -> int:
        """Admit waiting sequences while ``budget`` tokens are left; returns the prompt
        tokens prefilled for them in this step."""
        c = self.config
        prefill_tokens = computed = queried = cached_total = 0
        heap = self._waiting
        while self._num_waiting and len(self._running) < c.max_num_seqs and budget > 0:
            seq = heap[0][2]
            if seq.status is not Status.WAITING:  # aborted while waiting
                heapq.heappop(heap)
                continue
            total = seq.prompt_tokens + seq.generated
            # Room for this step's token of every running sequence and of this one.
            if self._kv_used + len(self._running) + total + 1 > c.kv_cache_tokens:
                break
            heapq.heappop(heap)
            self._num_waiting -= 1
            hit_blocks = self.prefix_cache.match(seq.block_hashes)
            # vLLM always recomputes at least the last prompt token to get logits.
            cached = min(hit_blocks * c.block_size, total - 1)
            queried += total
            cached_total += cached
            computed += total - cached
            seq.prefill_left = total - cached
            seq._chunk = min(seq.prefill_left, budget)
            budget -= seq._chunk
            prefill_tokens += seq._chunk
            self._chunked.append(seq)
            if seq.admitted_at is None:
                seq.admitted_at = now
                seq.cached_tokens = cached
                self.metrics.request_queue_time.observe(now - seq.arrival)
            seq.status = Status.RUNNING
            self._running[seq] = None
            self._kv_used += total
        if len(heap) > 2 * self._num_waiting + 64:
            self._compact_waiting()
        if queried:
            # Counters move once a step, not once a request: they are the hot path's cost.
            m = self.metrics
            m.prefix_cache_queries.inc(queried)
            m.prefix_cache_hits.inc(cached_total)
            m.prompt_tokens_cached.inc(cached_total)
            m.prompt_tokens_from_cache.inc(cached_total)
            m.prompt_tokens_computed.inc(computed)
        return prefill_tokens

    def _emit(self, now: float) -> None:
        m = self.metrics
        for seq in self._chunked:
            if seq.status is Status.RUNNING:  # not aborted during the step
                seq.prefill_left -= seq._chunk
                if seq.prefill_left:
                    self._partial[seq] = None  # no-op when it already was
                else:
                    self._partial.pop(seq, None)
                    # Blocks become reusable once computed: after the prompt's last chunk.
                    self.prefix_cache.insert(seq.block_hashes)
            seq._chunk = 0
        self._chunked.clear()
        finished: list[Sequence] = []
        prefilled = 0
        emitted = 0
        partial = self._partial
        for seq in self._running:
            if partial and seq in partial:  # still prefilling: no token yet
                continue
            emitted += 1
            seq.generated += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                m.time_to_first_token.observe(now - seq.arrival)
                prefilled += seq.prompt_tokens
            else:
                m.inter_token_latency.observe(now - seq.last_token_at)
            seq.last_token_at = now
            if seq.generated >= seq.target_tokens:
                finished.append(seq)
            elif seq.stream:
                seq._wake()
        self._kv_used += emitted
        generated = emitted - sum(1 for s in finished if s.pooling)
        if generated:
            m.generation_tokens.inc(generated)
        if prefilled:
            m.prompt_tokens.inc(prefilled)
        if finished:
            reasons: dict[str, int] = {}
            for seq in finished:
                self._finish(seq, now)
                reasons[seq.target_reason] = reasons.get(seq.target_reason, 0) + 1
            for reason, count in reasons.items():
                m.request_success[reason].inc(count)

    def _finish(self, seq: Sequence, now: float) -> None:
        del self._running[seq]
        self._kv_used -= seq.prompt_tokens + seq.generated
        seq.status = Status.FINISHED
        seq.finish_reason = seq.target_reason
        seq.finished_at = now
        self.metrics.e2e_request_latency.observe(now - seq.arrival)
        seq._wake()

    def _push_waiting(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        key = seq.priority if self._priority_policy else 0
        heapq.heappush(self._waiting, (key, seq._order, seq))
        self._num_waiting += 1

    def _compact_waiting(self) -> None:
        self._waiting = [e for e in self._waiting if e[2].status is Status.WAITING]
        heapq.heapify(self._waiting)
