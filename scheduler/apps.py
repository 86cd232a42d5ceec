from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Scheduler"

    def ready(self) -> None:
        # Bind @shared_task to our app (Valkey broker) in every Django process, not only in
        # the worker, so that .delay() from the web process reaches the right broker.
        import config.celery  # noqa: F401
