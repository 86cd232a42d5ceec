from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The operator's commands (``seed_demo``) beside the embedded stack and container roles:
    the demo spans every domain, so it sits above them all."""

    name = "ops"
    verbose_name = "Operations"
