from django.apps import AppConfig


class RecordsConfig(AppConfig):
    """What auditors and finance read (usage, decisions, findings, sealed transcripts). Its
    tables were made by the ``scheduler`` app's early migrations and keep their names."""

    name = "records"
    verbose_name = "Records"
