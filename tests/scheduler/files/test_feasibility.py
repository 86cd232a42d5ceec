"""The feasibility model: estimated tokens, earliest-deadline-first over windows, the batch
share, and the Valkey ledger's promises (atomic under concurrent registrations)."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime

import valkey

from governance.sla_windows import parse_windows
from scheduler.files import feasibility
from scheduler.files.feasibility import (
    CapacitySettings,
    Job,
    TokenRates,
    decide,
    edf_finish_times,
    estimate_tokens,
    job_intervals,
)

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC).timestamp()  # a Tuesday, noon UTC
HOUR = 3600.0


def anytime(job_id: str, tokens: float, deadline: float, *, start: float = NOW) -> Job:
    return Job(job_id, tokens, deadline, ((start, deadline),))


def test_tokens_come_from_what_was_declared_else_from_bytes() -> None:
    rates = TokenRates(per_audio_second=25, per_page=800, per_line=600, bytes_per_token=4)
    assert estimate_tokens(rates, declared_bytes=10**6, seconds=60) == 1500
    assert estimate_tokens(rates, declared_bytes=10**6, pages=3) == 2400
    assert estimate_tokens(rates, declared_bytes=10**6, lines=10) == 6000
    assert estimate_tokens(rates, declared_bytes=4001) == 1001  # rounded up
    assert estimate_tokens(rates, declared_bytes=1) == 1


def test_edf_runs_the_earliest_deadline_first_and_preempts() -> None:
    late = anytime("late", 3600, NOW + 10 * HOUR)
    soon = anytime("soon", 1800, NOW + HOUR, start=NOW + 600)
    finish = edf_finish_times([late, soon], rate=1.0, now=NOW)
    # "late" runs 600 s, "soon" takes over at its release for 1800 s, then "late" resumes.
    assert finish["soon"] == NOW + 600 + 1800
    assert finish["late"] == NOW + 3600 + 1800


def test_a_job_that_fits_is_accepted_with_its_eta() -> None:
    ok, eta, _ = decide([], anytime("a", 1000, NOW + HOUR), rate=1.0, now=NOW)
    assert ok
    assert eta == NOW + 1000


def test_a_new_job_may_not_make_an_old_promise_late() -> None:
    old = anytime("old", 3000, NOW + HOUR)
    # Alone the newcomer fits its own deadline (earlier than old's), but old would be late.
    newcomer = anytime("new", 1000, NOW + 1200)
    ok, eta, earliest = decide([old], newcomer, rate=1.0, now=NOW)
    assert not ok
    assert math.isinf(eta)
    # With a deadline after old's it runs after old: 3000 + 1000 seconds.
    assert abs(earliest - (NOW + 4000)) <= 1.0


def test_the_earliest_possible_is_itself_accepted() -> None:
    old = anytime("old", 3000, NOW + HOUR)
    newcomer = anytime("new", 1000, NOW + 1200)
    _, _, earliest = decide([old], newcomer, rate=1.0, now=NOW)
    retry = anytime("new", 1000, earliest)
    assert decide([old], retry, rate=1.0, now=NOW)[0]


def test_work_runs_only_inside_its_windows() -> None:
    # 20:00–06:00 UTC every day; it is noon, so nothing runs for 8 hours.
    nights = parse_windows([{"days": list(feasibility_days()), "start": "20:00", "end": "06:00"}])
    start = datetime.fromtimestamp(NOW, UTC)

    def spans(until: float) -> tuple[tuple[float, float], ...]:
        return job_intervals(nights, "UTC", start=start, end=datetime.fromtimestamp(until, UTC))

    deadline = NOW + 9 * HOUR  # 21:00
    job = Job("night", 1800, deadline, spans(deadline))
    ok, eta, _ = decide([], job, rate=1.0, now=NOW)
    assert ok
    assert eta == NOW + 8 * HOUR + 1800
    # 2 hours of work cannot be done by 21:00; the earliest is 22:00 the same night.
    big = Job("big", 2 * HOUR, deadline, spans(deadline))
    ok, _, earliest = decide([], big, rate=1.0, now=NOW, reintervals=spans)
    assert not ok
    assert abs(earliest - (NOW + 10 * HOUR)) <= 1.0


def feasibility_days() -> tuple[str, ...]:
    return ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def test_not_before_holds_the_work_back() -> None:
    job = anytime("held", 600, NOW + HOUR, start=NOW + 3000)
    ok, eta, _ = decide([], job, rate=1.0, now=NOW)
    assert ok
    assert eta == NOW + 3600
    too_late = anytime("held", 601, NOW + HOUR, start=NOW + 3000)
    assert not decide([], too_late, rate=1.0, now=NOW)[0]


def test_only_the_batch_share_of_capacity_is_promised(valkey_client: valkey.Valkey) -> None:
    settings = CapacitySettings(share=0.5, default_tokens_per_second=10.0)
    # No measurement: the default, and the answer says it is one.
    assert feasibility.batch_rate(valkey_client, "m", settings, now=NOW) == (5.0, False)
    valkey_client.hset(
        feasibility.throughput_key("m"), mapping={"capacity": "100", "at_ms": str(int(NOW * 1000))}
    )
    assert feasibility.batch_rate(valkey_client, "m", settings, now=NOW) == (50.0, True)
    # 100 tokens/s measured, half for batch: 50 tokens/s, so 3600 s take 180 000 tokens.
    fits = anytime("fits", 180_000, NOW + HOUR)
    assert feasibility.promise(valkey_client, "m", fits, settings, now=NOW).feasible
    more = anytime("more", 1, NOW + HOUR)
    answer = feasibility.promise(valkey_client, "m", more, settings, now=NOW)
    assert not answer.feasible
    assert answer.earliest_possible is not None


def test_a_stale_measurement_falls_back_to_the_default(valkey_client: valkey.Valkey) -> None:
    settings = CapacitySettings(share=1.0, default_tokens_per_second=7.0, stale_seconds=60)
    old = int((NOW - 120) * 1000)
    valkey_client.hset(feasibility.throughput_key("m"), mapping={"capacity": "100", "at_ms": old})
    assert feasibility.batch_rate(valkey_client, "m", settings, now=NOW) == (7.0, False)


def test_promises_are_released_and_expired(valkey_client: valkey.Valkey) -> None:
    settings = CapacitySettings(share=1.0, default_tokens_per_second=1.0)
    first = anytime("first", 3000, NOW + HOUR)
    assert feasibility.promise(valkey_client, "m", first, settings, now=NOW).feasible
    second = anytime("second", 3000, NOW + HOUR)
    assert not feasibility.promise(valkey_client, "m", second, settings, now=NOW).feasible
    assert feasibility.release(valkey_client, "m", "first")
    assert feasibility.promise(valkey_client, "m", second, settings, now=NOW).feasible
    # Past its deadline by more than the grace, a promise is dropped by the next check.
    later = NOW + HOUR + feasibility.PROMISE_GRACE_SECONDS + 1
    third = anytime("third", 10, later + HOUR, start=later)
    assert feasibility.promise(valkey_client, "m", third, settings, now=later).feasible
    assert valkey_client.hkeys(feasibility.ledger_key("m")) == [b"third"]


def test_concurrent_promises_that_fit_one_at_a_time_are_given_once(valkey_url: str) -> None:
    """Many registrations race for room for exactly one: exactly one is promised."""
    settings = CapacitySettings(share=1.0, default_tokens_per_second=1.0)
    setup = valkey.Valkey.from_url(valkey_url)
    setup.delete(feasibility.ledger_key("race"))
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def register(n: int) -> None:
        client = valkey.Valkey.from_url(valkey_url)
        job = anytime(f"job-{n}", 2000, NOW + HOUR)  # two of them need 4000 s of 3600
        barrier.wait()
        results.append(feasibility.promise(client, "race", job, settings, now=NOW).feasible)
        client.close()

    threads = [threading.Thread(target=register, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    assert setup.hlen(feasibility.ledger_key("race")) == 1
    setup.close()


def test_the_default_is_a_floor_under_a_light_measurement(valkey_client: valkey.Valkey) -> None:
    """A model only ever lightly used measured 3 tokens/s: not what it can do."""
    settings = CapacitySettings(share=0.5, default_tokens_per_second=10.0)
    at_ms = str(int(NOW * 1000))
    valkey_client.hset(feasibility.throughput_key("m"), mapping={"capacity": "3", "at_ms": at_ms})
    assert feasibility.batch_rate(valkey_client, "m", settings, now=NOW) == (5.0, True)


def test_the_schedule_starts_after_the_beat_has_dispatched(valkey_client: valkey.Valkey) -> None:
    """A job's first call waits for the upload consumer and the dispatcher: with a start lag
    the model plans from that late, so work that fills the whole turnaround no longer fits,
    and the ETA it gives includes the lag."""
    prompt = CapacitySettings(share=1.0, default_tokens_per_second=10.0)
    lagged = CapacitySettings(share=1.0, default_tokens_per_second=10.0, start_lag_seconds=4.0)
    # 10 tokens/s for 60 s: 600 tokens fit exactly with no lag, 560 with a 4 s lag.
    exact = anytime("exact", 600, NOW + 60)
    answer = feasibility.promise(valkey_client, "lag", exact, lagged, now=NOW)
    assert not answer.feasible
    assert answer.earliest_possible is not None
    # The bisection's second, quoted with the retry margin.
    quoted = answer.earliest_possible.timestamp() - feasibility.QUOTE_MARGIN_SECONDS
    assert NOW + 64 <= quoted <= NOW + 66
    assert feasibility.promise(valkey_client, "lag", exact, prompt, now=NOW).feasible
    assert feasibility.release(valkey_client, "lag", "exact")
    fits = anytime("fits", 560, NOW + 60)
    answer = feasibility.promise(valkey_client, "lag", fits, lagged, now=NOW)
    assert answer.feasible
    assert answer.eta == datetime.fromtimestamp(NOW + 60, UTC)
