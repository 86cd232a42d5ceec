"""The files domain's one table: the idempotent parts a file job is cut into.

A file registration, its S3 credentials and the OpenAI Files API's files are governance
tables (``governance.models``: created there, and officers' admin shows them); the code that
works on them lives in ``scheduler/files/``.
"""

from __future__ import annotations

from django.db import models


class PartState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class FilePart(models.Model):
    """One idempotent piece of a file's job: an audio segment, a range of pages or chunks, a
    range of batch lines. A done part is never run again, so a job whose worker died resumes
    from the parts still pending (scheduler/files/jobs.py). ``spec`` says what the part covers
    (its pipeline reads it); ``output_object`` names its result in the files bucket."""

    registration = models.ForeignKey(
        "governance.FileRegistration", on_delete=models.CASCADE, related_name="parts"
    )
    index = models.PositiveIntegerField()
    spec = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=PartState.choices, default=PartState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    output_object = models.CharField(max_length=1024, blank=True)
    tokens = models.PositiveBigIntegerField(default=0, help_text="Tokens the part's calls used")
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["registration", "index"]
        constraints = [
            models.UniqueConstraint(fields=["registration", "index"], name="file_part_index")
        ]
        indexes = [models.Index(fields=["registration", "state"], name="file_part_state")]

    def __str__(self) -> str:
        return f"part {self.index} of file {self.registration_id} ({self.state})"
