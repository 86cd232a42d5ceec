"""Bind a Keycloak client to a use case: its service-account tokens call the gateway as it.

The binding is optional (blank) and unique when set, so a client's token resolves to exactly
one use case. Schema only: the audit triggers of 0002 are on another table and untouched.
"""

import django.core.validators
from django.db import migrations, models

SERVICE_ACCOUNT_TAKEN = (
    "Another use case is already bound to this Keycloak client; a client acts as one use "
    "case only (unbind it there first)."
)


class Migration(migrations.Migration):
    dependencies = [("governance", "0003_default_priority_matrix")]

    operations = [
        migrations.AddField(
            model_name="usecase",
            name="service_account_client_id",
            field=models.CharField(
                blank=True,
                error_messages={"unique": SERVICE_ACCOUNT_TAKEN},
                help_text="Keycloak client whose service-account tokens call the gateway as "
                "this use case (client-credentials grant); empty: none",
                max_length=255,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$",
                        "Use the Keycloak client id: letters, digits and . _ : / @ - (max 255), "
                        "starting with a letter or digit.",
                    )
                ],
                verbose_name="service-account client",
            ),
        ),
        # The help text was reworded in models.py without a migration; state only, no SQL.
        migrations.AlterField(
            model_name="model",
            name="timeout_seconds",
            field=models.FloatField(
                default=60.0,
                help_text="Seconds for a whole request: seconds for an 8B model, minutes if it "
                "thinks",
                validators=[django.core.validators.MinValueValidator(0.1)],
            ),
        ),
        migrations.AddConstraint(
            model_name="usecase",
            constraint=models.UniqueConstraint(
                condition=models.Q(("service_account_client_id", ""), _negated=True),
                fields=("service_account_client_id",),
                name="one_use_case_per_service_account",
                violation_error_code="unique",
                violation_error_message=SERVICE_ACCOUNT_TAKEN,
            ),
        ),
    ]
