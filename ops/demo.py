"""The embedded demo's governance records: one tenant, two approved use cases, the fleet
and its prices (so the spend charts and My usage show spend).

The demo assistant records in full (so an auditor has transcripts to read and download); the
demo embeddings use case keeps metadata only, the default, to show the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from governance.audit import Actor
from governance.choices import (
    ApiKeyStatus,
    Environment,
    Namespace,
    RecordPolicy,
    UseCaseKind,
    UseCaseStatus,
)
from governance.models import (
    ApiKey,
    Deployment,
    Model,
    PriorityClass,
    PriorityRule,
    S3Credential,
    SlaClass,
    Tenant,
    UseCase,
)
from governance.prices import model_price_add
from governance.roles import Role, roles_set
from governance.services.api_keys import api_key_issue, api_key_revoke
from governance.services.generic_records import record_create, record_delete, record_update
from governance.services.guardrail_selections import guardrail_add
from governance.services.record_policy import use_case_set_records
from governance.services.use_cases import use_case_create, use_case_transition, use_case_update
from governance.sla_classes import sla_class_create
from scheduler.files.s3_credentials import s3_credential_issue, s3_credential_revoke

DEMO_TENANT = "demo"
DEMO_USE_CASE = "demo-assistant"
DEMO_METADATA_USE_CASE = "demo-embeddings"
DEMO_KEY_NAME = "embedded demo key"
ACTOR = Actor.system("demo-seed")


@dataclass(frozen=True)
class FleetModel:
    public_id: str
    capabilities: list[str]
    replicas: list[str]
    timeout_seconds: float = 60.0
    max_tokens: int | None = None


@dataclass(frozen=True)
class DemoSeed:
    key_plaintext: str
    admin_username: str
    admin_password: str | None  # None when the admin already existed
    s3_access_key_id: str = ""
    s3_secret: str = ""  # the demo S3 credential's secret, shown once like the key


def parse_fleet_arg(value: str) -> FleetModel:
    """``NAME=CAP[+CAP]=URL[,URL]``, e.g. ``llama=chat+completions=http://127.0.0.1:8101``."""
    try:
        name, caps, urls = value.split("=", 2)
    except ValueError as exc:
        raise ValueError(f"--model {value!r}: expected NAME=CAPABILITIES=URL[,URL]") from exc
    replicas = [u for u in urls.split(",") if u]
    if not name or not caps or not replicas:
        raise ValueError(f"--model {value!r}: name, capabilities and a URL are all required")
    return FleetModel(public_id=name, capabilities=caps.split("+"), replicas=replicas)


def _fleet(fleet: list[FleetModel]) -> list[Model]:
    models = []
    for entry in fleet:
        fields = {
            "capabilities": entry.capabilities,
            "timeout_seconds": entry.timeout_seconds,
            "max_tokens": entry.max_tokens,
        }
        existing = Model.objects.filter(public_id=entry.public_id).first()
        if existing is None:
            model = record_create(actor=ACTOR, instance=Model(public_id=entry.public_id, **fields))
        else:
            model = record_update(actor=ACTOR, instance=existing, changes=fields)
        deployments = list(model.deployments.all())
        wanted = {"served_name": entry.public_id, "replicas": entry.replicas}
        if deployments:
            record_update(actor=ACTOR, instance=deployments[0], changes=wanted)
            for stale in deployments[1:]:
                record_delete(actor=ACTOR, instance=stale)
        else:
            record_create(actor=ACTOR, instance=Deployment(model=model, **wanted))
        models.append(model)
    return models


# What the demo's models cost per million tokens (input, output), in the company's currency,
# by what they do: enough for the spend charts and My usage to show spend, in proportions a
# bank would recognise (answers cost more than questions, embeddings next to nothing).
DEMO_PRICES: dict[str, tuple[str, str]] = {
    "chat": ("0.20", "0.60"),
    "completions": ("0.20", "0.60"),
    "embeddings": ("0.02", "0"),
    "transcription": ("0.50", "0.50"),
    "guard": ("0.05", "0.05"),
}
# Before any usage the demo can have: a first price may start in the past, and so prices
# every request the demo has served, even one made before the seed that priced it.
DEMO_PRICES_FROM = "2025-01-01T00:00:00Z"


def _demo_prices(models: list[Model]) -> None:
    """A first price for each demo model that has none; a price an officer set (or a later
    one) stays as it is, and re-seeding adds nothing."""
    for model in models:
        if model.prices.exists():
            continue
        amounts = next((DEMO_PRICES[c] for c in model.capabilities if c in DEMO_PRICES), None)
        if amounts is None:
            continue
        model_price_add(
            actor=ACTOR,
            model=model,
            effective_from=DEMO_PRICES_FROM,
            input_per_mtok=amounts[0],
            output_per_mtok=amounts[1],
        )


def _demo_guardrails(use_case: UseCase, guard: Model | None) -> None:
    """What a bank's chatbot would select, so the demo shows guardrails at work: personal data
    redacted on the way in, credentials refused; suspected injections (the classifier's
    precision is 0.60, so it records rather than refuses here), toxic answers and (with a
    guard model in the fleet) financial advice recorded. Officers change them afterwards."""
    selections: list[tuple[str, str, str, dict[str, object]]] = [
        ("secrets", "request", "block", {}),
        ("invisible_text", "request", "redact", {}),
        ("pii", "request", "redact", {}),
        ("prompt_injection", "request", "flag", {}),  # precision 0.60: record, do not refuse
        ("toxicity", "response", "flag", {}),
    ]
    if guard is not None:
        selections.append(("banned_topics", "both", "flag", {"model": guard.public_id}))
    for guardrail, side, action, config in selections:
        guardrail_add(
            actor=ACTOR, use_case=use_case, guardrail=guardrail, side=side, action=action,
            config=config,
        )  # fmt: skip


WEEKDAY_NIGHTS_AND_WEEKENDS = [
    {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "20:00", "end": "06:00"},
    {"days": ["sat", "sun"], "start": "00:00", "end": "00:00"},
]


def _demo_sla_classes(use_case: UseCase) -> None:
    """Promises to show the difference: a voice note transcribed within five minutes at
    production priority, documents processed overnight at batch priority, and OpenAI Batch
    API jobs within a day (the "24h" completion window) at batch priority."""
    prod = PriorityRule.objects.filter(environment=Environment.PROD, namespace=Namespace.PROD)
    interactive_class = next(
        (rule.priority_class for rule in prod.select_related("priority_class")),
        PriorityClass.objects.order_by("rank").first(),
    )
    batch_class = (
        PriorityClass.objects.filter(name="batch").first()
        or PriorityClass.objects.order_by("-rank").first()
    )
    if interactive_class is None or batch_class is None:
        return  # no priority classes at all: nothing an SLA could run at
    existing = set(SlaClass.objects.filter(use_case=use_case).values_list("name", flat=True))
    if "interactive-5m" not in existing:
        sla_class_create(
            actor=ACTOR,
            use_case=use_case,
            name="interactive-5m",
            priority_class=interactive_class,
            description="Transcribed or read within five minutes of the upload, any time.",
            turnaround_seconds=300,
            kinds=["audio", "text"],
        )
    if "overnight" not in existing:
        sla_class_create(
            actor=ACTOR,
            use_case=use_case,
            name="overnight",
            priority_class=batch_class,
            description="Done by the end of the next window: weekday nights and weekends.",
            turnaround_seconds=None,
            windows=WEEKDAY_NIGHTS_AND_WEEKENDS,
            time_zone="Europe/Zurich",
            kinds=["pdf", "text", "batch"],
        )
    if "batch-24h" not in existing:
        sla_class_create(
            actor=ACTOR,
            use_case=use_case,
            name="batch-24h",
            priority_class=batch_class,
            description="OpenAI Batch API jobs: done within a day, in the fleet's idle capacity.",
            turnaround_seconds=24 * 3600,
            kinds=["batch"],
        )


def _approve(use_case: UseCase) -> None:
    if use_case.status == UseCaseStatus.DRAFT:
        use_case_transition(actor=ACTOR, use_case=use_case, transition="submit")
    if use_case.status == UseCaseStatus.SUBMITTED:
        use_case_transition(actor=ACTOR, use_case=use_case, transition="approve")


def _metadata_use_case(tenant: Tenant, models: list[Model]) -> None:
    """A second use case that keeps metadata only (who, when, model, tokens), no content."""
    use_case = UseCase.objects.filter(tenant=tenant, slug=DEMO_METADATA_USE_CASE).first()
    if use_case is None:
        use_case = use_case_create(
            actor=ACTOR,
            tenant=tenant,
            fields={
                "slug": DEMO_METADATA_USE_CASE,
                "name": "Demo embeddings",
                "kind": UseCaseKind.EMBEDDINGS,
                "purpose": "Search the demo's documents; only metadata is kept of each request.",
                "namespace": Namespace.DEV,
            },
        )
    embedders = [m for m in models if "embeddings" in m.capabilities]
    use_case_update(actor=ACTOR, use_case=use_case, changes={}, allowed_models=embedders)
    use_case_set_records(actor=ACTOR, use_case=use_case, policy=RecordPolicy.METADATA)
    _approve(use_case)


@transaction.atomic
def demo_seed(*, fleet: list[FleetModel], admin_password: str) -> DemoSeed:
    """Create or refresh the demo; mint a fresh key and revoke the previous demo keys.

    Re-running is safe: rows are updated in place (the fleet's ports may have changed), and
    since plaintext keys are never stored, each run mints a new key to print.
    """
    models = _fleet(fleet)
    _demo_prices(models)
    tenant = Tenant.objects.filter(slug=DEMO_TENANT).first() or record_create(
        actor=ACTOR,
        instance=Tenant(
            slug=DEMO_TENANT,
            name="Demo business unit",
            business_unit="Platform demo",
            application_id="APP-0001",
            environment=Environment.DEV,
            owner_email="platform-team@example.invalid",
        ),
    )
    use_case = UseCase.objects.filter(tenant=tenant, slug=DEMO_USE_CASE).first()
    if use_case is None:
        use_case = use_case_create(
            actor=ACTOR,
            tenant=tenant,
            fields={
                "slug": DEMO_USE_CASE,
                "name": "Demo assistant",
                "kind": UseCaseKind.CHATBOT,
                "purpose": "Try Switchyard end to end on the embedded stack.",
                "namespace": Namespace.DEV,
            },
        )
    # A guard model answers guardrails' questions, not the demo key's requests.
    callable_models = [m for m in models if m.capabilities != ["guard"]]
    use_case_update(actor=ACTOR, use_case=use_case, changes={}, allowed_models=callable_models)
    if not use_case.guardrails.exists():
        _demo_guardrails(
            use_case, guard=next((m for m in models if "guard" in m.capabilities), None)
        )
    # Every run, as the allowed models: the demo exists to show transcripts to an auditor.
    use_case_set_records(actor=ACTOR, use_case=use_case, policy=RecordPolicy.FULL)
    _demo_sla_classes(use_case)
    _approve(use_case)
    _metadata_use_case(tenant, models)

    for old in ApiKey.objects.filter(
        use_case=use_case, name=DEMO_KEY_NAME, status=ApiKeyStatus.ACTIVE
    ):
        api_key_revoke(actor=ACTOR, key=old, reason="superseded by a new make up")
    _, plaintext = api_key_issue(actor=ACTOR, use_case=use_case, name=DEMO_KEY_NAME)
    # An S3 credential to upload registered files with, minted afresh like the key.
    for credential in S3Credential.objects.filter(
        use_case=use_case, name=DEMO_KEY_NAME, status=ApiKeyStatus.ACTIVE
    ):
        s3_credential_revoke(actor=ACTOR, credential=credential, reason="superseded")
    s3_credential, s3_secret = s3_credential_issue(
        actor=ACTOR, use_case=use_case, name=DEMO_KEY_NAME
    )

    user_model = get_user_model()
    created_password: str | None = None
    if not user_model.objects.filter(username="admin").exists():
        admin = user_model.objects.create_superuser(
            "admin", "admin@example.invalid", admin_password
        )
        roles_set(admin, [Role.ADMIN])
        tenant.members.add(admin)
        created_password = admin_password
    return DemoSeed(
        key_plaintext=plaintext,
        admin_username="admin",
        admin_password=created_password,
        s3_access_key_id=s3_credential.access_key_id,
        s3_secret=s3_secret,
    )
