"""Drop DRF's authtoken table: its tokens were stored in plaintext and never expired.

Automation authenticates with Keycloak service-account JWTs; ``rest_framework.authtoken`` is
no longer installed, so its table (and the secrets in it) must not linger either.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def drop_tokens(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    schema_editor.execute("DROP TABLE IF EXISTS authtoken_token")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")
    content_type = apps.get_model("contenttypes", "ContentType")
    content_type.objects.filter(app_label="authtoken").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0004_use_case_service_account"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(drop_tokens, migrations.RunPython.noop)]
