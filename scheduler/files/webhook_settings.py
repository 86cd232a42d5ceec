"""A use case's webhook: where Switchyard tells the team a file has ended
(scheduler/files/webhooks.py).

Officers and the tenant's developers set the URL. Each time a URL is set a new signing secret
(``whsec_`` + base64 of 24 random bytes) is made and returned once — it is stored sealed
(records/sealing.py), because signing needs the secret itself, and never shown again.
Clearing the URL drops the secret. Both are audited, without the secret.
"""

from __future__ import annotations

import base64

from django.core.exceptions import ValidationError
from django.db import transaction

from governance.audit import Actor, audit_record
from governance.models import UseCase
from governance.services.authority import require_member
from governance.webhook_urls import WebhookRefused, check_url
from records.sealing import seal
from scheduler.files.webhooks import new_secret

MAX_URL_CHARS = 500  # UseCase.webhook_url max_length


def webhook_set(*, actor: Actor, use_case: UseCase, url: str) -> str | None:
    """Set (or, with ``""``, clear) the use case's webhook; the new secret, shown once."""
    require_member(actor, use_case.tenant)
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
