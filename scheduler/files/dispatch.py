"""The dispatcher: which queued file jobs run now, in which order, and how many at once.

Beat runs ``file_jobs_dispatch`` every ``SWITCHYARD_FILE_JOBS_DISPATCH_SECONDS`` (2). A job may
run when its ``not_before`` has passed and one of its SLA class's processing windows is open
(no class, or a class without windows: any time). Among those, earliest deadline first (the
``promised_by`` the upload re-promised), up to ``SWITCHYARD_FILE_JOBS_CONCURRENCY`` jobs
holding a lease at once across all workers. Each job handed out gets a lease
(scheduler/files/leases.py) first, so two dispatchers cannot hand out the same job, and a job
whose worker died (``running`` with no live lease) is handed out again and resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

import valkey
from celery import current_app
from django.conf import settings
from django.utils import timezone

from governance.choices import FileState
from governance.models import FileRegistration
from governance.sla_windows import WindowError, open_intervals, parse_windows, zone
from governance.store import valkey_client
from scheduler.files.leases import lease_take, leases_held

logger = logging.getLogger(__name__)

#: scheduler/files/tasks.py's task, sent by name (those tasks import this module).
RUN_FILE_JOB_TASK = "scheduler.run_file_job"
SCAN_LIMIT = 1000  # waiting jobs looked at per run, earliest deadline first
Send = Callable[[int, str], None]


def may_run(registration: FileRegistration, now: datetime) -> bool:
    """Not before its ``not_before``, and inside one of its SLA class's windows."""
    if registration.not_before is not None and now < registration.not_before:
        return False
    sla_class = registration.sla_class
    if sla_class is None or not sla_class.windows:
        return True
    try:
        windows = parse_windows(sla_class.windows)
        tz = zone(sla_class.time_zone)
    except WindowError:
        return False  # a misconfigured class holds its jobs rather than run them at random
    first = next(open_intervals(windows, tz, now), None)
    return first is not None and first[0] <= now < first[1]


def dispatch_order(now: datetime, *, limit: int = SCAN_LIMIT) -> list[FileRegistration]:
    """Queued and running jobs that may run at ``now``, earliest deadline first."""
    waiting = (
        FileRegistration.objects.filter(state__in=[FileState.QUEUED, FileState.RUNNING])
        .select_related("sla_class")
        .order_by("promised_by", "pk")[:limit]
    )
    return [registration for registration in waiting if may_run(registration, now)]


def _send_task(registration_id: int, token: str) -> None:
    """Queue the job's run by task name (scheduler/files/tasks.py imports this module)."""
    current_app.send_task(RUN_FILE_JOB_TASK, args=(registration_id, token))


def file_jobs_dispatch(
    *,
    now: datetime | None = None,
    client: valkey.Valkey | None = None,
    concurrency: int | None = None,
    send: Send = _send_task,
) -> list[int]:
    """Hand out the jobs that may run now; the ids handed out, in the order sent."""
    now = now or timezone.now()
    client = client or valkey_client()
    bound = concurrency if concurrency is not None else settings.FILE_JOBS_CONCURRENCY
    candidates = dispatch_order(now)
    active = FileRegistration.objects.filter(
        state__in=[FileState.QUEUED, FileState.RUNNING]
    ).values_list("pk", flat=True)[: SCAN_LIMIT * 2]
    held = leases_held(client, list(active))
    free = bound - len(held)
    sent: list[int] = []
    for registration in candidates:
        if free <= 0:
            break
        if registration.pk in held:
            continue
        token = lease_take(client, registration.pk, settings.FILE_JOB_LEASE_SECONDS)
        if token is None:
            continue  # another dispatcher took it a moment ago
        send(registration.pk, token)
        sent.append(registration.pk)
        free -= 1
    if sent:
        logger.info("file_jobs_dispatched ids=%s", ",".join(map(str, sent)))
    return sent
