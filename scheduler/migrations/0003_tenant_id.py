"""Key admission decisions by the tenant's id, not the slug the gateway saw.

Existing rows take the id from their use case (whose tenant never changes), else from the
slug as it stands now.
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def backfill(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    decision = apps.get_model("scheduler", "AdmissionDecision")
    use_cases = dict(apps.get_model("governance", "UseCase").objects.values_list("pk", "tenant_id"))
    by_slug = dict(apps.get_model("governance", "Tenant").objects.values_list("slug", "pk"))
    pairs = decision.objects.values_list("use_case_id", "tenant").distinct()
    for use_case_id, slug in list(pairs):
        tenant_id = use_cases.get(use_case_id, by_slug.get(slug))
        if tenant_id is not None:
            decision.objects.filter(use_case_id=use_case_id, tenant=slug).update(
                tenant_id=tenant_id
            )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0002_admission_decision_audit_sequence"),
        ("governance", "0006_tenant_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="admissiondecision",
            name="tenant_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="admissiondecision",
            name="tenant",
            field=models.CharField(help_text="The slug as the gateway saw it.", max_length=100),
        ),
        migrations.AddIndex(
            model_name="admissiondecision",
            index=models.Index(fields=["tenant_id", "occurred_at"], name="decision_tenant_id_time"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
