"""Four eyes and owners only, whatever the door: no one approves their own request, only a
key's owner rotates it (and so receives its secret), and an actor with no user is not the
platform unless it says so.

Personas: alice and carol develop for acme, olivia and oscar are governance officers, root an
admin; the platform acts as ``Actor.system(...)`` or as an operator's ``--actor`` name.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from django.urls import reverse
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import ApiKey, AuditEvent, Tenant, UseCase
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyApplyFailed
from governance.policy_as_code.schema import policy_parse
from governance.roles import Role
from governance.services.api_keys import (
    api_key_decide,
    api_key_issue,
    api_key_request,
    api_key_reveal,
    api_key_revoke,
    api_key_rotate,
)
from governance.services.generic_records import record_create
from governance.services.use_cases import use_case_create, use_case_transition
from testkit.factories import PASSWORD, make_model, make_tenant, make_use_case, make_user
from tests.governance.test_policy_as_code_validation import acme_policy

# acme_policy selects a company's own guardrail (testkit/detectors.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]

SELF_KEY = "You requested this key; another officer must approve it."
SELF_USE_CASE = "You submitted this use case; another officer must approve it."
NOT_OWNER_ROTATE = "Only the person who requested this key can rotate it."


@pytest.fixture
def world() -> dict[str, Any]:
    acme = make_tenant("acme")
    llama = make_model("llama")
    users = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "carol": make_user("carol", Role.DEVELOPER, tenants=(acme,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "oscar": make_user("oscar", Role.OFFICER),
        "root": make_user("root", Role.ADMIN),
    }
    users["root"].is_staff = users["root"].is_superuser = True
    users["root"].save()
    return {
        "acme": acme,
        "llama": llama,
        "chatbot": make_use_case(acme, "chatbot", models=(llama,)),
        "users": users,
        **{name: Actor.for_user(user) for name, user in users.items()},
    }


def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def submitted_by(world: dict[str, Any], who: str, slug: str = "rag") -> UseCase:
    draft = make_use_case(world["acme"], slug, status=UseCaseStatus.DRAFT)
    return use_case_transition(actor=world[who], use_case=draft, transition="submit")


def active_key_of(world: dict[str, Any], who: str) -> ApiKey:
    key = api_key_request(actor=world[who], use_case=world["chatbot"], name="ci", reason="CI")
    api_key_decide(actor=world["olivia" if who != "olivia" else "oscar"], key=key, approve=True)
    return api_key_reveal(actor=world[who], key=key)[0]


# --- 16: the approver is never the requester ----------------------------------------------
def test_an_officer_cannot_approve_her_own_key_request_in_the_services(world) -> None:
    key = api_key_request(actor=world["olivia"], use_case=world["chatbot"], name="me", reason="x")
    with pytest.raises(PermissionDenied, match=SELF_KEY):
        api_key_decide(actor=world["olivia"], key=key, approve=True)
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING
    assert key.decided_by is None
    approved = api_key_decide(actor=world["oscar"], key=key, approve=True)
    assert approved.status == ApiKeyStatus.APPROVED
    assert approved.decided_by == world["users"]["oscar"]


def test_an_officer_cannot_approve_a_use_case_she_submitted_in_the_services(world) -> None:
    use_case = submitted_by(world, "olivia")
    with pytest.raises(PermissionDenied, match=SELF_USE_CASE):
        use_case_transition(actor=world["olivia"], use_case=use_case, transition="approve")
    assert UseCase.objects.get(pk=use_case.pk).status == UseCaseStatus.SUBMITTED
    approved = use_case_transition(actor=world["oscar"], use_case=use_case, transition="approve")
    assert approved.status == UseCaseStatus.APPROVED


def test_self_approval_is_refused_through_the_api(world) -> None:
    olivia = api(world["users"]["olivia"])
    requested = olivia.post(
        "/api/api-keys/",
        {"use_case": world["chatbot"].pk, "name": "mine", "reason": "a key for me"},
        format="json",
    )
    assert requested.status_code == 201, requested.data
    key_id = requested.data["id"]
    approved = olivia.post(f"/api/api-keys/{key_id}/approve/", {}, format="json")
    assert approved.status_code == 403, approved.data
    assert SELF_KEY in str(approved.data["detail"])
    assert ApiKey.objects.get(pk=key_id).status == ApiKeyStatus.PENDING

    use_case = submitted_by(world, "olivia")
    refused = olivia.post(f"/api/use-cases/{use_case.pk}/approve/", {}, format="json")
    assert refused.status_code == 403, refused.data
    assert SELF_USE_CASE in str(refused.data["detail"])
    oscar = api(world["users"]["oscar"])
    assert oscar.post(f"/api/api-keys/{key_id}/approve/", {}, format="json").status_code == 200


def test_self_approval_is_refused_in_the_portal(world) -> None:
    olivia = browser(world["users"]["olivia"])
    asked = olivia.post(
        reverse("portal:key_request", args=[world["chatbot"].pk]),
        {"name": "mine", "reason": "a key for me"},
    )
    assert asked.status_code == 302
    key = ApiKey.objects.get(name="mine")
    response = olivia.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "approve"})
    assert response.status_code == 403
    assert SELF_KEY in response.content.decode()
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING
    # The review queue offers her no Approve button for it; it does for oscar.
    queue = olivia.get(reverse("portal:review")).content.decode()
    assert f"/keys/{key.pk}/decide/" not in queue
    assert (
        f"/keys/{key.pk}/decide/"
        in browser(world["users"]["oscar"]).get(reverse("portal:review")).content.decode()
    )

    use_case = submitted_by(world, "olivia")
    response = olivia.post(
        reverse("portal:use_case_transition", args=[use_case.pk]), {"transition": "approve"}
    )
    assert response.status_code == 403
    assert SELF_USE_CASE in response.content.decode()
    assert UseCase.objects.get(pk=use_case.pk).status == UseCaseStatus.SUBMITTED


def test_self_approval_is_refused_in_the_admin(world) -> None:
    admin = Client()
    assert admin.login(username="root", password=PASSWORD)
    key = api_key_request(actor=world["root"], use_case=world["chatbot"], name="mine", reason="x")
    page = admin.post(
        "/admin/governance/apikey/",
        {"action": "approve", "_selected_action": [key.pk]},
        follow=True,
    )
    assert SELF_KEY in page.content.decode()
    assert ApiKey.objects.get(pk=key.pk).status == ApiKeyStatus.PENDING

    use_case = submitted_by(world, "root")
    page = admin.post(
        "/admin/governance/usecase/",
        {"action": "approve", "_selected_action": [use_case.pk]},
        follow=True,
    )
    assert SELF_USE_CASE in page.content.decode()
    assert UseCase.objects.get(pk=use_case.pk).status == UseCaseStatus.SUBMITTED


def test_policy_as_code_cannot_approve_what_its_operator_submitted(world) -> None:
    """GIVEN the acme policy applied as a draft, then submitted by olivia in the portal
    WHEN olivia applies the file that declares it approved (``policy apply --actor olivia``)
    THEN the apply is refused and changes nothing; priya's apply of the same file approves."""
    data = acme_policy()
    data["use_cases"][0]["status"] = "draft"
    world["chatbot"].delete()  # the file creates it afresh, as a draft
    priya = Actor(username="priya", is_system=True)
    policy_apply(document=policy_parse(data), actor=priya)
    use_case = UseCase.objects.get(tenant__slug="acme", slug="chatbot")
    use_case_transition(actor=world["olivia"], use_case=use_case, transition="submit")

    data["use_cases"][0]["status"] = "approved"
    with pytest.raises(PolicyApplyFailed, match=SELF_USE_CASE):
        policy_apply(document=policy_parse(data), actor=Actor(username="olivia", is_system=True))
    assert UseCase.objects.get(pk=use_case.pk).status == UseCaseStatus.SUBMITTED
    policy_apply(document=policy_parse(data), actor=priya)
    assert UseCase.objects.get(pk=use_case.pk).status == UseCaseStatus.APPROVED


# --- 17: only a key's owner rotates it ------------------------------------------------------
@pytest.mark.parametrize("who", ["carol", "olivia", "root"])
def test_no_one_but_the_owner_rotates_a_key_in_the_services(world, who: str) -> None:
    key = active_key_of(world, "alice")
    with pytest.raises(PermissionDenied, match=NOT_OWNER_ROTATE):
        api_key_rotate(actor=world[who], key=key)
    assert not ApiKey.objects.filter(rotated_from=key).exists()
    successor, secret = api_key_rotate(actor=world["alice"], key=key)
    assert successor.requested_by == world["users"]["alice"]
    assert secret.startswith(successor.prefix)


@pytest.mark.parametrize("who", ["carol", "olivia"])
def test_no_one_but_the_owner_rotates_a_key_through_the_api(world, who: str) -> None:
    key = active_key_of(world, "alice")
    response = api(world["users"][who]).post(f"/api/api-keys/{key.pk}/rotate/", {}, format="json")
    assert response.status_code == 403, response.data
    assert "secret" not in response.data
    assert NOT_OWNER_ROTATE in str(response.data["detail"])
    assert not ApiKey.objects.filter(rotated_from=key).exists()
    # An officer may still revoke it; that hands out no secret.
    if who == "olivia":
        revoked = api(world["users"]["olivia"]).post(
            f"/api/api-keys/{key.pk}/revoke/", {"reason": "leaked"}, format="json"
        )
        assert revoked.status_code == 200
        assert revoked.data["status"] == ApiKeyStatus.REVOKED


@pytest.mark.parametrize("who", ["carol", "olivia"])
def test_no_one_but_the_owner_rotates_a_key_in_the_portal(world, who: str) -> None:
    key = active_key_of(world, "alice")
    person = browser(world["users"][who])
    detail = person.get(reverse("portal:key_detail", args=[key.pk])).content.decode()
    assert "Rotate key" not in detail
    response = person.post(reverse("portal:key_rotate", args=[key.pk]))
    assert response.status_code == 403
    assert NOT_OWNER_ROTATE in response.content.decode()
    assert 'id="secret-key"' not in response.content.decode()
    assert not ApiKey.objects.filter(rotated_from=key).exists()
    owner = browser(world["users"]["alice"])
    assert "Rotate key" in owner.get(reverse("portal:key_detail", args=[key.pk])).content.decode()


# --- 22: an actor with no user is refused, unless it is the platform -------------------------
def anonymous_actor() -> Actor:
    request = RequestFactory().post("/api/tenants/")
    request.user = AnonymousUser()
    return Actor.from_request(request)


def test_an_anonymous_actor_is_refused_by_every_service(world) -> None:
    nobody = anonymous_actor()
    assert nobody.user is None
    assert not nobody.is_system
    pending = api_key_request(actor=world["alice"], use_case=world["chatbot"], name="p", reason="x")
    draft = make_use_case(world["acme"], "draft", status=UseCaseStatus.DRAFT)
    events = AuditEvent.objects.count()
    calls = {
        "record_create": lambda: record_create(
            actor=nobody,
            instance=Tenant(
                slug="initech",
                name="Initech",
                business_unit="BU",
                application_id="APP-9",
                environment="uat",
                owner_email="o@initech.example",
            ),
        ),
        "use_case_create": lambda: use_case_create(
            actor=nobody, tenant=world["acme"], fields={"slug": "x", "name": "X", "purpose": "p"}
        ),
        "use_case_transition": lambda: use_case_transition(
            actor=nobody, use_case=draft, transition="submit"
        ),
        "api_key_request": lambda: api_key_request(
            actor=nobody, use_case=world["chatbot"], name="n", reason="r"
        ),
        "api_key_decide": lambda: api_key_decide(actor=nobody, key=pending, approve=True),
        "api_key_revoke": lambda: api_key_revoke(actor=nobody, key=pending),
        "api_key_issue": lambda: api_key_issue(actor=nobody, use_case=world["chatbot"], name="n"),
    }
    let_through = []
    for name, call in calls.items():
        try:
            call()
        except PermissionDenied:
            continue
        let_through.append(name)
    assert let_through == [], f"these services let an anonymous actor through: {let_through}"
    assert AuditEvent.objects.count() == events
    assert ApiKey.objects.get(pk=pending.pk).status == ApiKeyStatus.PENDING
    assert UseCase.objects.get(pk=draft.pk).status == UseCaseStatus.DRAFT
    assert not Tenant.objects.filter(slug="initech").exists()


def test_an_actor_with_a_name_but_no_flag_is_not_the_platform(world) -> None:
    """Only Actor.system() and an operator's explicit ``is_system`` skip the role checks."""
    stranger = Actor(username="system:pretend")
    with pytest.raises(PermissionDenied):
        api_key_issue(actor=stranger, use_case=world["chatbot"], name="n")
    key, secret = api_key_issue(actor=Actor.system("tests"), use_case=world["chatbot"], name="n")
    assert key.status == ApiKeyStatus.ACTIVE
    assert secret.startswith(key.prefix)
