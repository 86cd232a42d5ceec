"""Key audit history by the tenant's id, not its slug (which can be renamed and reused).

Existing events get their tenant's id from the object they are about where it names the
tenant for certain (a tenant, a use case, an API key), else from the slug as it stands now.
Their hashes were computed without the id (``hash_version`` null), so the chain still
verifies; new events' hashes cover it (``hash_version`` 2). The append-only trigger is lifted
for the one backfill UPDATE, inside this migration's transaction, and put back.
"""

import importlib
from collections import defaultdict

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

_append_only = importlib.import_module("governance.migrations.0002_audit_append_only")


def _tenant_ids(apps: StateApps) -> dict[int, list[int]]:
    """Event pk lists per tenant id, for the events that were recorded with a tenant."""
    event = apps.get_model("governance", "AuditEvent")
    by_slug = dict(apps.get_model("governance", "Tenant").objects.values_list("slug", "pk"))
    use_cases = dict(apps.get_model("governance", "UseCase").objects.values_list("pk", "tenant_id"))
    keys = dict(
        apps.get_model("governance", "ApiKey").objects.values_list("pk", "use_case__tenant_id")
    )
    found: dict[int, list[int]] = defaultdict(list)
    rows = (
        event.objects.exclude(tenant_slug="")
        .values_list("pk", "object_type", "object_id", "tenant_slug")
        .iterator(chunk_size=2000)
    )
    for pk, object_type, object_id, slug in rows:
        tenant_id = None
        if object_id.isdigit():
            if object_type == "governance.tenant":
                tenant_id = int(object_id)
            elif object_type == "governance.usecase":
                tenant_id = use_cases.get(int(object_id))
            elif object_type == "governance.apikey":
                tenant_id = keys.get(int(object_id))
        if tenant_id is None:
            tenant_id = by_slug.get(slug)
        if tenant_id is not None:
            found[tenant_id].append(pk)
    return found


def backfill(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    event = apps.get_model("governance", "AuditEvent")
    found = _tenant_ids(apps)
    if not found:
        return
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE governance_auditevent DISABLE TRIGGER audit_event_append_only"
        )
    elif vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS audit_event_no_update")
    for tenant_id, pks in found.items():
        for start in range(0, len(pks), 500):
            event.objects.filter(pk__in=pks[start : start + 500]).update(tenant_id=tenant_id)
    if vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE governance_auditevent ENABLE TRIGGER audit_event_append_only"
        )
    elif vendor == "sqlite":
        schema_editor.execute(_append_only.SQLITE[0])


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0005_drop_drf_authtoken"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="tenant_id",
            field=models.BigIntegerField(blank=True, db_index=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
