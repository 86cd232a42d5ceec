from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    """Deferred GPU work: the dynamic batcher (``scheduler.batcher``) and file jobs
    (``scheduler.files``)."""

    name = "scheduler"
    verbose_name = "Scheduler"

    def ready(self) -> None:
        # A file's end queues its webhook: the receiver of the state machine's signal.
        import scheduler.files.webhooks  # noqa: F401
