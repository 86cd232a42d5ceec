"""File registrations: a file announced before it arrives, answered at once (docs/files.md).

``file_register`` checks the ask (who, which model, which SLA), estimates the file's tokens,
and asks the feasibility model (scheduler/files/feasibility.py) whether the promise can be kept
beside every promise already made on that model. Accepted, the registration is stored,
the promise recorded in the model's Valkey ledger and the event audited; refused, nothing is
stored and the caller learns the earliest completion that could have been promised.
``file_cancel`` ends a registration and releases its promise.

The upload consumer, the job runner and the batch API (scheduler/files/uploads.py,
scheduler/files/jobs.py, scheduler/files/openai_batches.py) move it on through the state machine
(scheduler/files/states.py) and release the promise when it ends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record, object_state
from governance.choices import Capability, FileKind, FileState, UseCaseStatus
from governance.errors import Conflict
from governance.models import ApiKey, FileRegistration, Model, SlaClass, UseCase
from governance.services.authority import require_member
from governance.sla_windows import Window, WindowError, open_intervals, parse_windows, zone
from governance.store import valkey_client
from scheduler.files import feasibility
from scheduler.files.feasibility import Answer, CapacitySettings, Interval, Job, TokenRates
from scheduler.files.filenames import filename_problem
from scheduler.files.states import file_cancelled

# The capabilities a model needs to run each kind of file.
KIND_CAPABILITIES: dict[str, frozenset[str]] = {
    FileKind.AUDIO: frozenset({Capability.TRANSCRIPTION}),
    FileKind.PDF: frozenset({Capability.CHAT, Capability.COMPLETIONS}),
    FileKind.TEXT: frozenset({Capability.CHAT, Capability.COMPLETIONS}),
    FileKind.BATCH: frozenset({Capability.CHAT, Capability.COMPLETIONS, Capability.EMBEDDINGS}),
}
# States a registration can still be cancelled from (the work has not ended).


class Infeasible(Exception):
    """The promise cannot be kept; ``earliest_possible`` is the earliest that could be."""

    def __init__(self, message: str, answer: Answer) -> None:
        super().__init__(message)
        self.answer = answer

    @property
    def earliest_possible(self) -> datetime | None:
        return self.answer.earliest_possible


@dataclass(frozen=True)
class Registered:
    file: FileRegistration
    answer: Answer


def capacity_settings() -> CapacitySettings:
    return CapacitySettings(
        share=settings.BATCH_CAPACITY_SHARE,
        default_tokens_per_second=settings.BATCH_DEFAULT_TOKENS_PER_SECOND,
        model_tokens_per_second=settings.BATCH_MODEL_TOKENS_PER_SECOND,
        start_lag_seconds=settings.FILE_JOBS_START_LAG_SECONDS,
    )


def token_rates() -> TokenRates:
    return TokenRates(
        per_audio_second=settings.FILE_TOKENS_PER_AUDIO_SECOND,
        per_page=settings.FILE_TOKENS_PER_PAGE,
        per_line=settings.FILE_TOKENS_PER_LINE,
        bytes_per_token=settings.FILE_BYTES_PER_TOKEN,
    )


def key_actor(key: ApiKey, *, request_id: str = "", source_ip: str | None = None) -> Actor:
    """The actor of a request made with an API key: named by its visible prefix."""
    return Actor(username=f"key:{key.prefix}", request_id=request_id, source_ip=source_ip)


def _require_registrant(actor: Actor, use_case: UseCase, api_key: ApiKey | None) -> None:
    """A key of the use case itself, or a developer of its tenant (officers, admins too)."""
    if api_key is not None:
        if api_key.use_case_id != use_case.pk:
            raise PermissionDenied("This API key belongs to another use case.")
        return
    require_member(actor, use_case.tenant)


def _check(
    *,
    use_case: UseCase,
    kind: str,
    filename: str,
    model: Model,
    declared_bytes: int,
    measures: dict[str, float | int | None],
    sla_class: SlaClass | None,
    deadline: datetime | None,
    not_before: datetime | None,
    now: datetime,
) -> None:
    errors: dict[str, str] = {}
    if kind not in FileKind.values:
        errors["kind"] = f"Unknown kind {kind!r}; one of {', '.join(FileKind.values)}."
    # The name ends its object keys: never a path (scheduler/files/filenames.py).
    if (problem := filename_problem(filename)) is not None:
        errors["filename"] = problem
    if declared_bytes <= 0:
        errors["declared_bytes"] = "The file's size in bytes, more than zero."
    given = [name for name, value in measures.items() if value is not None]
    if len(given) > 1:
        errors[given[1]] = f"Declare one of {', '.join(measures)}, not several."
    for name in given:
        value = measures[name]
        if value is not None and value <= 0:
            errors[name] = "Must be more than zero."
    if (sla_class is None) == (deadline is None):
        errors["sla_class"] = "Give exactly one of sla_class and deadline."
    if deadline is not None and deadline <= now:
        errors["deadline"] = "The deadline must be in the future."
    if not_before is not None and deadline is not None and not_before >= deadline:
        errors["not_before"] = "not_before must come before the deadline."
    if sla_class is not None:
        if sla_class.use_case_id != use_case.pk:
            errors["sla_class"] = "This SLA class belongs to another use case."
        else:
            if kind not in sla_class.kinds:
                errors["kind"] = (
                    f"The SLA class '{sla_class.name}' takes {', '.join(sla_class.kinds) or 'no'}"
                    f" files, not {kind}."
                )
            if declared_bytes > sla_class.max_file_bytes:
                errors["declared_bytes"] = (
                    f"The SLA class '{sla_class.name}' takes files of at most "
                    f"{sla_class.max_file_bytes} bytes."
                )
    if not use_case.allowed_models.filter(pk=model.pk).exists():
        errors["model"] = f"The use case may not use the model '{model.public_id}'."
    elif kind in KIND_CAPABILITIES and not KIND_CAPABILITIES[kind] & set(model.capabilities):
        errors["model"] = (
            f"The model '{model.public_id}' cannot process {kind} files (it needs one of "
            f"{', '.join(sorted(KIND_CAPABILITIES[kind]))})."
        )
    if errors:
        raise ValidationError(errors)


def _schedule(
    sla_class: SlaClass | None, deadline: datetime | None, start: datetime
) -> tuple[list[datetime], feasibility.Reintervals]:
    """The deadlines to try promising, in order, and the job's intervals up to any deadline.

    An SLA class without a turnaround promises "by the end of the next window": the window
    open now (or the next to open), and if the work does not fit in what is left of it, the
    one after — a file registered five minutes before a night window closes is promised for
    the next night, not refused."""
    windows: tuple[Window, ...] = ()
    tz_name = "UTC"
    deadlines = [deadline] if deadline is not None else []
    if sla_class is not None:
        try:
            windows = parse_windows(sla_class.windows)
            zone(sla_class.time_zone)
        except WindowError as exc:
            raise Conflict(f"The SLA class '{sla_class.name}' is misconfigured: {exc}") from exc
        tz_name = sla_class.time_zone
        if sla_class.turnaround_seconds is not None:
            deadlines = [start + timedelta(seconds=sla_class.turnaround_seconds)]
        elif windows:
            spans = open_intervals(windows, zone(tz_name), start)
            deadlines = [end for _, end in itertools.islice(spans, 2)]
        else:
            raise Conflict(
                f"The SLA class '{sla_class.name}' has neither a turnaround nor windows."
            )

    def reintervals(until: float) -> tuple[Interval, ...]:
        return feasibility.job_intervals(
            windows, tz_name, start=start, end=datetime.fromtimestamp(until, UTC)
        )

    return deadlines, reintervals


def file_register(
    *,
    actor: Actor,
    use_case: UseCase,
    kind: str,
    filename: str,
    model: Model,
    declared_bytes: int,
    declared_seconds: float | None = None,
    declared_pages: int | None = None,
    declared_lines: int | None = None,
    sla_class: SlaClass | None = None,
    deadline: datetime | None = None,
    not_before: datetime | None = None,
    api_key: ApiKey | None = None,
) -> Registered:
    """Register a file if its promise can be kept; Infeasible (nothing stored) if not."""
    _require_registrant(actor, use_case, api_key)
    if use_case.status != UseCaseStatus.APPROVED:
        raise Conflict(f"The use case is {use_case.status}; only approved use cases take files.")
    now = timezone.now()
    _check(
        use_case=use_case,
        kind=kind,
        filename=filename,
        model=model,
        declared_bytes=declared_bytes,
        measures={
            "declared_seconds": declared_seconds,
            "declared_pages": declared_pages,
            "declared_lines": declared_lines,
        },
        sla_class=sla_class,
        deadline=deadline,
        not_before=not_before,
        now=now,
    )
    start = max(now, not_before) if not_before is not None else now
    deadlines, reintervals = _schedule(sla_class, deadline, start)
    tokens = feasibility.estimate_tokens(
        token_rates(),
        declared_bytes=declared_bytes,
        seconds=declared_seconds,
        pages=declared_pages,
        lines=declared_lines,
    )
    client = valkey_client()
    promised = False
    try:
        with transaction.atomic():
            file = FileRegistration.objects.create(
                use_case=use_case,
                registered_by=actor.username[:150],
                api_key=api_key,
                kind=kind,
                filename=filename,
                model=model,
                declared_bytes=declared_bytes,
                declared_seconds=declared_seconds,
                declared_pages=declared_pages,
                declared_lines=declared_lines,
                sla_class=sla_class,
                deadline=deadline,
                not_before=not_before,
                state=FileState.REGISTERED,
                state_changed_at=now,
                estimated_tokens=tokens,
                promised_by=deadlines[0],
            )
            for promised_by in deadlines:
                job = Job(
                    id=str(file.pk),
                    tokens=float(tokens),
                    deadline=promised_by.timestamp(),
                    intervals=reintervals(promised_by.timestamp()),
                )
                answer = feasibility.promise(
                    client,
                    model.public_id,
                    job,
                    capacity_settings(),
                    now=now.timestamp(),
                    reintervals=reintervals,
                )
                if answer.feasible:
                    break
            if not answer.feasible:
                raise Infeasible(
                    f"{model.public_id} cannot finish {tokens} more tokens by "
                    f"{promised_by.isoformat()} beside the work already promised.",
                    answer,
                )
            promised = True
            if promised_by != file.promised_by:
                file.promised_by = promised_by
                file.save(update_fields=["promised_by", "updated_at"])
            audit_record(
                actor=actor,
                action="file.register",
                obj=file,
                after={
                    **object_state(file),
                    "eta": answer.eta,
                    "rate_tokens_per_second": answer.rate,
                    "rate_measured": answer.measured,
                },
                tenant_slug=use_case.tenant.slug,
                tenant_id=use_case.tenant_id,
            )
    except BaseException:
        if promised:
            feasibility.release(client, model.public_id, str(file.pk))
        raise
    return Registered(file, answer)


def file_cancel(
    *, actor: Actor, file: FileRegistration, api_key: ApiKey | None = None, reason: str = ""
) -> FileRegistration:
    """Cancel a registration whose work has not ended, and release its promise."""
    _require_registrant(actor, file.use_case, api_key)
    file = file_cancelled(actor=actor, registration=file, reason=reason)
    feasibility.release(valkey_client(), file.model.public_id, str(file.pk))
    return file
