"""The governance rules, whatever the door: lifecycle, key reveal-once, rotation, scoping.

Personas: alice develops for acme, bob for globex, olivia is an officer, audrey an auditor.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from governance.audit import Actor, audit_verify
from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.errors import Conflict
from governance.keys import key_hash
from governance.models import ApiKey, AuditEvent, Tenant
from governance.roles import Role
from governance.services.api_keys import (
    api_key_decide,
    api_key_request,
    api_key_reveal,
    api_key_revoke,
    api_key_rotate,
)
from governance.services.generic_records import record_create
from governance.services.use_cases import use_case_create, use_case_transition, use_case_update
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    people = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
    }
    actors = {name: Actor.for_user(user) for name, user in people.items()}
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    return {"acme": acme, "globex": globex, "llama": llama, "chatbot": chatbot, **actors}


def approved_key(world, name: str = "ci") -> tuple[ApiKey, str]:
    key = api_key_request(actor=world["alice"], use_case=world["chatbot"], name=name, reason="CI")
    api_key_decide(actor=world["olivia"], key=key, approve=True)
    return api_key_reveal(actor=world["alice"], key=key)


# --- use cases ----------------------------------------------------------------------------
def test_a_use_case_goes_from_draft_to_approved_with_who_and_when(world) -> None:
    draft = use_case_create(
        actor=world["alice"],
        tenant=world["acme"],
        fields={"slug": "rag", "name": "RAG", "kind": "rag", "purpose": "Search the policies."},
    )
    assert draft.status == UseCaseStatus.DRAFT
    use_case_transition(actor=world["alice"], use_case=draft, transition="submit")
    approved = use_case_transition(actor=world["olivia"], use_case=draft, transition="approve")
    assert approved.status == UseCaseStatus.APPROVED
    assert approved.status_changed_by.username == "olivia"
    assert approved.status_changed_at is not None
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert actions == ["usecase.create", "usecase.submit", "usecase.approve"]


def test_developers_cannot_approve_and_officers_must_say_why_they_suspend(world) -> None:
    with pytest.raises(PermissionDenied):
        use_case_transition(
            actor=world["alice"], use_case=world["chatbot"], transition="suspend", reason="x"
        )
    with pytest.raises(ValidationError, match="reason"):
        use_case_transition(actor=world["olivia"], use_case=world["chatbot"], transition="suspend")
    use_case_transition(
        actor=world["olivia"], use_case=world["chatbot"], transition="suspend", reason="incident 42"
    )
    with pytest.raises(Conflict, match="suspended"):
        use_case_transition(actor=world["olivia"], use_case=world["chatbot"], transition="approve")


def test_developers_work_only_on_their_own_tenants_drafts(world) -> None:
    fields = {"slug": "x", "name": "X", "kind": "agent", "purpose": "p"}
    with pytest.raises(PermissionDenied, match="acme"):
        use_case_create(actor=world["bob"], tenant=world["acme"], fields=fields)
    with pytest.raises(PermissionDenied, match="officer"):
        use_case_create(
            actor=world["alice"],
            tenant=world["acme"],
            fields={**fields, "tokens_per_minute": 10**9},
        )
    with pytest.raises(PermissionDenied, match="submitted"):
        use_case_update(
            actor=world["alice"], use_case=world["chatbot"], changes={"purpose": "other"}
        )


def test_governance_records_are_for_officers_and_bad_values_are_refused(world) -> None:
    tenant = Tenant(
        slug="initech",
        name="Initech",
        business_unit="BU",
        application_id="APP-7",
        environment="uat",
        owner_email="o@initech.example",
    )
    with pytest.raises(PermissionDenied):
        record_create(actor=world["alice"], instance=tenant)
    with pytest.raises(PermissionDenied):
        record_create(actor=world["audrey"], instance=tenant)
    bad = Tenant(
        slug="Bad Slug",
        name="x",
        business_unit="x",
        application_id="nope",
        environment="mars",
        owner_email="not-an-email",
    )
    with pytest.raises(ValidationError) as caught:
        record_create(actor=world["olivia"], instance=bad)
    assert {"slug", "application_id", "environment", "owner_email"} <= set(
        caught.value.message_dict
    )
    record_create(actor=world["olivia"], instance=tenant)
    assert AuditEvent.objects.filter(action="tenant.create", tenant_slug="initech").exists()


# --- keys ---------------------------------------------------------------------------------
def test_a_key_is_requested_approved_then_revealed_exactly_once(world) -> None:
    key = api_key_request(
        actor=world["alice"], use_case=world["chatbot"], name="ci", reason="CI jobs"
    )
    assert key.status == ApiKeyStatus.PENDING
    assert key.key_hash is None  # no secret exists before the reveal
    with pytest.raises(Conflict, match="approved"):
        api_key_reveal(actor=world["alice"], key=key)
    api_key_decide(actor=world["olivia"], key=key, approve=True)
    with pytest.raises(PermissionDenied, match="requested"):
        api_key_reveal(actor=world["olivia"], key=key)
    revealed, plaintext = api_key_reveal(actor=world["alice"], key=key)
    assert revealed.status == ApiKeyStatus.ACTIVE
    assert revealed.key_hash == key_hash(plaintext)
    assert revealed.prefix == plaintext[:12]
    with pytest.raises(Conflict, match="already revealed"):
        api_key_reveal(actor=world["alice"], key=key)
    # The secret is nowhere in the audit trail.
    for event in AuditEvent.objects.all():
        assert plaintext not in str(event.before) + str(event.after)
        assert key_hash(plaintext) not in str(event.before) + str(event.after)
    assert audit_verify().ok


def test_key_requests_need_an_approved_use_case_a_reason_and_a_sane_expiry(world) -> None:
    draft = make_use_case(world["acme"], "draft", status=UseCaseStatus.DRAFT)
    with pytest.raises(Conflict, match="approved use cases"):
        api_key_request(actor=world["alice"], use_case=draft, name="k", reason="r")
    with pytest.raises(ValidationError, match="reason"):
        api_key_request(actor=world["alice"], use_case=world["chatbot"], name="k", reason=" ")
    with pytest.raises(ValidationError, match="future"):
        api_key_request(
            actor=world["alice"],
            use_case=world["chatbot"],
            name="k",
            reason="r",
            expires_at=timezone.now() - timedelta(minutes=1),
        )
    with pytest.raises(ValidationError, match="at most"):
        api_key_request(
            actor=world["alice"],
            use_case=world["chatbot"],
            name="k",
            reason="r",
            expires_at=timezone.now() + timedelta(days=4000),
        )
    with pytest.raises(PermissionDenied):
        api_key_request(actor=world["bob"], use_case=world["chatbot"], name="k", reason="r")


def test_a_rejection_needs_a_reason_and_a_decision_is_made_once(world) -> None:
    key = api_key_request(actor=world["alice"], use_case=world["chatbot"], name="k", reason="r")
    with pytest.raises(ValidationError, match="reason"):
        api_key_decide(actor=world["olivia"], key=key, approve=False)
    with pytest.raises(PermissionDenied):
        api_key_decide(actor=world["audrey"], key=key, approve=True)
    api_key_decide(actor=world["olivia"], key=key, approve=False, reason="use the shared key")
    with pytest.raises(Conflict, match="already decided"):
        api_key_decide(actor=world["olivia"], key=key, approve=True)


def test_rotation_gives_a_new_key_and_the_old_one_a_grace_period(world) -> None:
    old, old_plaintext = approved_key(world)
    new, new_plaintext = api_key_rotate(actor=world["alice"], key=old, grace=timedelta(hours=1))
    old.refresh_from_db()
    assert new.status == old.status == ApiKeyStatus.ACTIVE
    assert new_plaintext != old_plaintext
    assert new.rotated_from == old
    assert old.expires_at is not None
    assert timedelta(minutes=59) < old.expires_at - timezone.now() <= timedelta(hours=1)
    with pytest.raises(Conflict, match="already rotated"):
        api_key_rotate(actor=world["alice"], key=old)
    with pytest.raises(PermissionDenied):
        api_key_rotate(actor=world["bob"], key=new)


def test_revoking_is_final(world) -> None:
    key, _ = approved_key(world)
    with pytest.raises(PermissionDenied):
        api_key_revoke(actor=world["bob"], key=key)
    api_key_revoke(actor=world["alice"], key=key, reason="leaked in a log")
    with pytest.raises(Conflict, match="revoked"):
        api_key_revoke(actor=world["olivia"], key=key)
    with pytest.raises(Conflict):
        api_key_rotate(actor=world["alice"], key=key)
