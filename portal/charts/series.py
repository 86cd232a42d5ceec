"""A use case's usage as chart series: tokens, spend, refusals by reason, guardrail findings
and queue waits, summed into fixed UTC buckets from the roll-ups the persister already keeps.

Every series is computed here once and rendered three ways (the chart, its table, its CSV),
so what a person hovers, reads and downloads are the same numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from django.db.models import Count, Max, Sum
from django.db.models.functions import TruncHour

from governance.prices import amount_text, currency, money_text
from portal.charts.spend import usage_priced
from portal.selectors import decision_reason_text
from records.models import AdmissionDecision, GuardrailHour, UsageMinute

RangeName = Literal["24h", "7d", "30d"]


@dataclass(frozen=True)
class TimeRange:
    name: RangeName
    label: str
    bucket: timedelta
    buckets: int


# Buckets are whole hours (the guardrail roll-up's grain), aligned on UTC.
RANGES: dict[str, TimeRange] = {
    "24h": TimeRange("24h", "24 hours", timedelta(hours=1), 24),
    "7d": TimeRange("7d", "7 days", timedelta(hours=6), 28),
    "30d": TimeRange("30d", "30 days", timedelta(days=1), 30),
}
DEFAULT_RANGE = "24h"

# Colours with at least 4.5:1 contrast on white, distinguishable in hue and order.
PALETTE = ("#1f4e9c", "#b3261e", "#1b6e3a", "#8a5a00", "#6b3fa0", "#00607a", "#9c1f6e", "#4a4a4a")

CHART_NAMES = ("tokens", "spend", "refusals", "findings", "waits")
NO_PRICE = "no price"  # a spend cell whose usage had no price in force: unknown, not 0
# A count, or an amount of money (None: no price was in force for that usage).
Value = int | Decimal | None
REFUSALS = (AdmissionDecision.Kind.REJECTED, AdmissionDecision.Kind.SHED)


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[Value]


@dataclass(frozen=True)
class Chart:
    name: str
    title: str
    caption: str
    kind: Literal["bar", "line"]
    unit: str
    stacked: bool
    starts: list[datetime]
    series: list[Series]
    # Set for money: the values are exact Decimals in this currency, or None ("no price").
    currency: str = ""
    # Said under the chart, whether or not it has series (e.g. usage that has no price).
    notice: str = ""

    @property
    def script_id(self) -> str:
        return f"chart-{self.name}-data"

    @property
    def total(self) -> int | Decimal | None:
        """The sum over the range, for counts and money (a sum of waits means nothing); an
        amount sums what was priced (the notice says what was not)."""
        if not self.stacked:
            return None
        values = [v for s in self.series for v in s.values if v is not None]
        return sum(values, Decimal(0)) if self.currency else sum(int(v) for v in values)

    @property
    def total_text(self) -> str:
        total = self.total
        if total is None:
            return ""
        return money_text(Decimal(total)) if self.currency else str(total)

    def _text(self, value: Value) -> str:
        """A value for people: an amount to the cent, a count as it is."""
        if value is None:
            return NO_PRICE
        return money_text(Decimal(value)) if self.currency else str(value)

    def _exact(self, value: Value) -> str:
        """A value for a CSV or a program: every digit of an amount."""
        if value is None:
            return NO_PRICE
        return amount_text(value) if isinstance(value, Decimal) else str(value)

    @property
    def rows(self) -> list[tuple[datetime, list[str]]]:
        """The table alternative: one row a bucket, one value a series, as people read it."""
        return [
            (start, [self._text(s.values[i]) for s in self.series])
            for i, start in enumerate(self.starts)
        ]

    def config(self) -> dict[str, Any]:
        """What charts.js hands to Chart.js (read from a json_script element, never inline).

        Amounts go as exact decimal strings (Chart.js reads them as numbers to draw) with
        the text the table shows, which the tooltip quotes, so hover and table agree."""
        datasets: list[dict[str, Any]] = []
        for i, s in enumerate(self.series):
            dataset: dict[str, Any] = {"label": s.label, "color": PALETTE[i % len(PALETTE)]}
            if self.currency:
                dataset["data"] = [None if v is None else self._exact(v) for v in s.values]
                dataset["display"] = [self._text(v) for v in s.values]
            else:
                dataset["data"] = s.values
            datasets.append(dataset)
        return {
            "type": self.kind,
            "unit": self.unit,
            "stacked": self.stacked,
            "title": self.title,
            "currency": self.currency,
            "labels": [_label(start, self.starts) for start in self.starts],
            "datasets": datasets,
        }

    def csv_rows(self) -> list[list[str]]:
        suffix = f" ({self.currency})" if self.currency else ""
        header = ["bucket_start_utc", *(f"{s.label}{suffix}" for s in self.series)]
        body = [
            [start.strftime("%Y-%m-%dT%H:%M:%SZ"), *(self._exact(s.values[i]) for s in self.series)]
            for i, start in enumerate(self.starts)
        ]
        return [header, *body]


def _label(start: datetime, starts: list[datetime]) -> str:
    if len(starts) > 1 and starts[1] - starts[0] >= timedelta(days=1):
        return start.strftime("%Y-%m-%d")
    return start.strftime("%m-%d %H:%M")


def bucket_starts(time_range: TimeRange, now: datetime) -> list[datetime]:
    """The buckets' starts, oldest first; the last bucket holds ``now`` (it is still filling)."""
    size = int(time_range.bucket.total_seconds())
    last = datetime.fromtimestamp(int(now.timestamp()) // size * size, tz=UTC)
    return [last - time_range.bucket * i for i in range(time_range.buckets - 1, -1, -1)]


class _Buckets:
    def __init__(self, starts: list[datetime], size: timedelta) -> None:
        self.starts = starts
        self.first = starts[0]
        self.end = starts[-1] + size
        self.size = size

    def index(self, moment: datetime) -> int:
        return int((moment.astimezone(UTC) - self.first) // self.size)

    def fold(self, pairs: Iterable[tuple[datetime, int]]) -> list[int]:
        values = [0] * len(self.starts)
        for moment, value in pairs:
            values[self.index(moment)] += int(value or 0)
        return values


def use_case_charts(use_case_id: int, time_range: TimeRange, now: datetime) -> list[Chart]:
    starts = bucket_starts(time_range, now)
    buckets = _Buckets(starts, time_range.bucket)
    return [
        _tokens(use_case_id, buckets),
        _spend(use_case_id, buckets),
        _refusals(use_case_id, buckets),
        _findings(use_case_id, buckets),
        _waits(use_case_id, buckets),
    ]


def chart_named(charts: list[Chart], name: str) -> Chart | None:
    return next((chart for chart in charts if chart.name == name), None)


def _hours(rows: Any, field: str) -> Any:
    """Rows summed per hour in the database (at most 720 rows for 30 days)."""
    return rows.annotate(at=TruncHour(field, tzinfo=UTC)).order_by("at")


def _tokens(use_case_id: int, b: _Buckets) -> Chart:
    rows = (
        _hours(
            UsageMinute.objects.filter(
                use_case_id=use_case_id, minute__gte=b.first, minute__lt=b.end
            ),
            "minute",
        )
        .values("at")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    rows = list(rows)
    return Chart(
        name="tokens",
        title="Tokens",
        caption=(
            "Tokens used per period, prompt and completion stacked; the spend chart prices them."
        ),
        kind="bar",
        unit="tokens",
        stacked=True,
        starts=b.starts,
        series=[
            Series("Prompt tokens", b.fold((r["at"], r["prompt"]) for r in rows)),
            Series("Completion tokens", b.fold((r["at"], r["completion"]) for r in rows)),
        ]
        if rows
        else [],
    )


def _spend(use_case_id: int, b: _Buckets) -> Chart:
    """Spend per model, each minute's tokens priced with the price in force then (a price
    that changes mid-period splits the period at its start)."""
    usage = _hours(
        UsageMinute.objects.filter(use_case_id=use_case_id, minute__gte=b.first, minute__lt=b.end),
        "minute",
    )
    amounts: dict[str, list[Decimal]] = {}
    priced: dict[str, set[int]] = defaultdict(set)
    unpriced: dict[str, set[int]] = defaultdict(set)
    unpriced_tokens: dict[str, int] = defaultdict(int)
    for part in usage_priced(usage, ("at",)):
        i = b.index(part.group[0])
        cells = amounts.setdefault(part.model, [Decimal(0)] * len(b.starts))
        amount = part.amount
        if amount is not None:
            cells[i] += amount
            priced[part.model].add(i)
        elif part.tokens:
            unpriced[part.model].add(i)
            unpriced_tokens[part.model] += part.tokens
    code = currency()
    series = [
        Series(
            model,
            [
                None if i in unpriced[model] and i not in priced[model] else cells[i]
                for i in range(len(cells))
            ],
        )
        for model, cells in sorted(amounts.items())
        if priced[model]  # a model never priced in the period has nothing to draw
    ]
    notice = ""
    if unpriced_tokens:
        listed = ", ".join(f"{m} ({n:,} tokens)" for m, n in sorted(unpriced_tokens.items()))
        notice = f"No price was in force for some usage, which is not in the amounts: {listed}."
    return Chart(
        name="spend",
        title="Spend",
        caption=(
            f"Spend per period in {code}, by model: each minute's tokens at the model's price "
            "in force then (a new price applies from its start, never to earlier usage)."
        ),
        kind="bar",
        unit=code,
        stacked=True,
        starts=b.starts,
        series=series,
        currency=code,
        notice=notice,
    )


def _refusals(use_case_id: int, b: _Buckets) -> Chart:
    rows = list(
        _hours(
            AdmissionDecision.objects.filter(
                use_case_id=use_case_id,
                decision__in=REFUSALS,
                occurred_at__gte=b.first,
                occurred_at__lt=b.end,
            ),
            "occurred_at",
        )
        .values("at", "decision", "reason")
        .annotate(n=Count("id"))
    )
    by_reason: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for r in rows:
        text = decision_reason_text(r["decision"], r["reason"]) or r["decision"]
        by_reason[text].append((r["at"], r["n"]))
    return Chart(
        name="refusals",
        title="Refusals by reason",
        caption="Requests the gateway refused or shed at the queue deadline, by reason.",
        kind="bar",
        unit="requests",
        stacked=True,
        starts=b.starts,
        series=[Series(reason, b.fold(by_reason[reason])) for reason in sorted(by_reason)],
    )


def _findings(use_case_id: int, b: _Buckets) -> Chart:
    rows = (
        GuardrailHour.objects.filter(use_case_id=use_case_id, hour__gte=b.first, hour__lt=b.end)
        .values("hour", "guardrail", "action")
        .annotate(n=Sum("findings"))
        .order_by("hour")
    )
    by_name: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for r in rows:
        by_name[f"{r['guardrail']} ({r['action']})"].append((r["hour"], r["n"]))
    return Chart(
        name="findings",
        title="Guardrail findings",
        caption="Findings per period, by guardrail and the action it took.",
        kind="bar",
        unit="findings",
        stacked=True,
        starts=b.starts,
        series=[Series(name, b.fold(by_name[name])) for name in sorted(by_name)],
    )


def _waits(use_case_id: int, b: _Buckets) -> Chart:
    usage = list(
        _hours(
            UsageMinute.objects.filter(
                use_case_id=use_case_id, minute__gte=b.first, minute__lt=b.end
            ),
            "minute",
        )
        .values("at")
        .annotate(queued=Sum("queued_ms"), requests=Sum("requests"))
    )
    queued_ms = b.fold((r["at"], r["queued"]) for r in usage)
    requests = b.fold((r["at"], r["requests"]) for r in usage)
    longest = [0] * len(b.starts)
    waits = (
        _hours(
            AdmissionDecision.objects.filter(
                use_case_id=use_case_id,
                decision=AdmissionDecision.Kind.QUEUED,
                occurred_at__gte=b.first,
                occurred_at__lt=b.end,
            ),
            "occurred_at",
        )
        .values("at")
        .annotate(longest=Max("queued_ms"))
    )
    for r in waits:
        i = b.index(r["at"])
        longest[i] = max(longest[i], int(r["longest"] or 0))
    recorded = bool(usage) or any(longest)
    return Chart(
        name="waits",
        title="Queue waits",
        caption=(
            "Mean time a request spent queued (all requests of the period) and the longest "
            "recorded queue wait, in milliseconds."
        ),
        kind="line",
        unit="ms",
        stacked=False,
        starts=b.starts,
        series=[
            Series(
                "Mean wait (ms)",
                [q // n if n else 0 for q, n in zip(queued_ms, requests, strict=True)],
            ),
            Series("Longest wait (ms)", longest),
        ]
        if recorded
        else [],
    )
