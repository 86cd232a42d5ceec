"""A default priority matrix, so a fresh install ranks traffic sensibly before anyone edits it.

Rows are the tenant's environment, columns the caller's namespace. Production traffic from
prod and prod-DR comes first, then production demos; UAT next; test and dev traffic, and QA
namespaces, soak up what is left. Batch work has its own lowest class.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

CLASSES = [
    # name, rank, vLLM priority, queue timeout (s), max queue length
    ("critical", 0, 0, 60.0, 2000),
    ("high", 1, 1, 30.0, 2000),
    ("standard", 2, 2, 30.0, 1000),
    ("low", 3, 3, 15.0, 500),
    ("batch", 4, 4, 600.0, 10000),
]
NAMESPACES = ["prod-dr", "prod", "demo", "uat", "qa", "dev"]
MATRIX = {
    "prod": ["critical", "critical", "high", "standard", "low", "low"],
    "uat": ["standard", "standard", "standard", "standard", "low", "low"],
    "test": ["low", "low", "low", "low", "low", "low"],
    "dev": ["low", "low", "low", "low", "low", "low"],
}


def seed(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    priority_class = apps.get_model("governance", "PriorityClass")
    priority_rule = apps.get_model("governance", "PriorityRule")
    by_name = {}
    for name, rank, vllm, timeout, length in CLASSES:
        by_name[name], _ = priority_class.objects.get_or_create(
            name=name,
            defaults={"rank": rank, "vllm_priority": vllm, "queue_timeout_seconds": timeout,
                      "max_queue_length": length},
        )
    for environment, row in MATRIX.items():
        for namespace, class_name in zip(NAMESPACES, row, strict=True):
            priority_rule.objects.get_or_create(
                environment=environment, namespace=namespace,
                defaults={"priority_class": by_name[class_name]},
            )


class Migration(migrations.Migration):
    dependencies = [("governance", "0002_audit_append_only")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
