"""Make the audit table append-only in the database itself, not only in the ORM.

An UPDATE or DELETE on governance_auditevent fails on SQLite and PostgreSQL alike, so even a
raw SQL session of an over-privileged operator cannot quietly rewrite history (it would have
to drop the trigger, which is itself visible in the schema — and the hash chain still breaks).
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

SQLITE = [
    """CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON governance_auditevent
       BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END""",
    # Deleting is allowed only once the chain head is gone, i.e. when the whole trail is being
    # reset (a test database flush deletes the head first); audit_verify reports events
    # without a head, so this path cannot hide a deletion either.
    """CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON governance_auditevent
       WHEN EXISTS (SELECT 1 FROM governance_auditchainhead)
       BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS audit_event_no_update",
    "DROP TRIGGER IF EXISTS audit_event_no_delete",
]
POSTGRES = [
    """CREATE OR REPLACE FUNCTION governance_audit_append_only() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'audit events are append-only'; END; $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON governance_auditevent
       FOR EACH ROW EXECUTE FUNCTION governance_audit_append_only()""",
]
POSTGRES_DROP = [
    "DROP TRIGGER IF EXISTS audit_event_append_only ON governance_auditevent",
    "DROP FUNCTION IF EXISTS governance_audit_append_only()",
]


def _run(statements: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    def apply(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement)

    return apply


class Migration(migrations.Migration):
    dependencies = [("governance", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE, "postgresql": POSTGRES}),
            _run({"sqlite": SQLITE_DROP, "postgresql": POSTGRES_DROP}),
        )
    ]
