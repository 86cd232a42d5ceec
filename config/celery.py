"""The Celery application: Valkey as broker and result backend, JSON only."""

from __future__ import annotations

import os

from celery import Celery

from scheduler.schedules import BEAT_SCHEDULE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.beat_schedule = BEAT_SCHEDULE
app.autodiscover_tasks()
