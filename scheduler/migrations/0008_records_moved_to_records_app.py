"""The records' models now belong to the records app (records/migrations/0001_initial.py):
removed from this app's state only; their tables stay as they are."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0007_admission_decision_retry_after"),
        ("records", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name="AdmissionDecision",
                ),
                migrations.DeleteModel(
                    name="GuardrailFinding",
                ),
                migrations.DeleteModel(
                    name="GuardrailHour",
                ),
                migrations.RemoveField(
                    model_name="interactionrecord",
                    name="object",
                ),
                migrations.DeleteModel(
                    name="StreamCursor",
                ),
                migrations.DeleteModel(
                    name="UsageMinute",
                ),
                migrations.DeleteModel(
                    name="InteractionRecord",
                ),
                migrations.DeleteModel(
                    name="RecordObject",
                ),
            ],
            database_operations=[],
        ),
    ]
