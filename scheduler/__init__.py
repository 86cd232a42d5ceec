"""Celery work: file jobs, batch jobs, pipelines, roll-ups and periodic upkeep."""
