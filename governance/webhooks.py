"""A use case's webhook: where Switchyard tells the team a file has ended (scheduler/webhooks.py).

Officers and the tenant's developers set the URL. Each time a URL is set a new signing secret
(``whsec_`` + base64 of 24 random bytes) is made and returned once — it is stored sealed
(scheduler/sealing.py), because signing needs the secret itself, and never shown again.
Clearing the URL drops the secret. Both are audited, without the secret.
"""

from __future__ import annotations

import base64

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from governance.audit import Actor, audit_record
from governance.models import UseCase
from governance.roles import Role, can_govern, has_role
from scheduler.sealing import seal
from scheduler.webhooks import WebhookRefused, check_url, new_secret

MAX_URL_CHARS = 500  # UseCase.webhook_url max_length


def _require_webhook_editor(actor: Actor, use_case: UseCase) -> None:
    if actor.is_system:
        return
    user = actor.user
    if user is None or not user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    if can_govern(user):
        return
    if has_role(user, Role.DEVELOPER) and use_case.tenant.members.filter(pk=user.pk).exists():
        return
    raise PermissionDenied(f"You are not a developer of tenant '{use_case.tenant.slug}'.")


def webhook_set(*, actor: Actor, use_case: UseCase, url: str) -> str | None:
    """Set (or, with ``""``, clear) the use case's webhook; the new secret, shown once."""
    _require_webhook_editor(actor, use_case)
    url = url.strip()
    if url:
        if len(url) > MAX_URL_CHARS:
            raise ValidationError({"webhook_url": f"At most {MAX_URL_CHARS} characters."})
        try:
            check_url(url)
        except WebhookRefused as exc:
            raise ValidationError({"webhook_url": str(exc)}) from exc
    secret = new_secret() if url else None
    before = {"webhook_url": use_case.webhook_url}
    with transaction.atomic():
        use_case.webhook_url = url
        use_case.webhook_secret_sealed = (
            base64.b64encode(seal(secret.encode())).decode() if secret else ""
        )
        use_case.save(update_fields=["webhook_url", "webhook_secret_sealed", "updated_at"])
        audit_record(
            actor=actor,
            action="usecase.webhook_set",
            obj=use_case,
            before=before,
            after={"webhook_url": url, "secret_rotated": bool(secret)},
            tenant_slug=use_case.tenant.slug,
            tenant_id=use_case.tenant_id,
        )
    return secret
