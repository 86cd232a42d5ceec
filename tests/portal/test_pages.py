from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from governance.models import Deployment, Model

pytestmark = pytest.mark.django_db


def test_the_home_page_shows_the_gateway_and_the_model_catalogue(client: Client, settings) -> None:
    settings.GATEWAY_PUBLIC_URL = "http://gw.example:8080"
    model = Model.objects.create(public_id="llama-3.1-8b-instruct", capabilities=["chat"])
    Deployment.objects.create(model=model, served_name="llama", replicas=["http://a", "http://b"])
    page = client.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "http://gw.example:8080/v1" in html
    assert "llama-3.1-8b-instruct" in html
    assert "<td>2</td>" in html  # two replicas


def test_the_admin_asks_for_a_login_then_opens_for_a_superuser(client: Client) -> None:
    assert client.get("/admin/").status_code == 302
    get_user_model().objects.create_superuser("root", "root@example.invalid", "pw-x-123456")
    client.login(username="root", password="pw-x-123456")
    page = client.get("/admin/governance/apikey/")
    assert page.status_code == 200


SIGNED_IN_AS = '<span class="who">{}'  # the header's "signed in as", first thing in it


def test_local_login_works_in_the_embedded_demo(client: Client) -> None:
    get_user_model().objects.create_user("alice", password="pw-x-123456")
    # Before signing in, the header names no one (so the check below can fail).
    assert SIGNED_IN_AS.format("") not in client.get("/").content.decode()
    response = client.post(
        reverse("portal:login"), {"username": "alice", "password": "pw-x-123456"}
    )
    assert response.status_code == 302
    assert SIGNED_IN_AS.format("alice") in client.get("/").content.decode()


def test_a_wrong_password_signs_no_one_in(client: Client) -> None:
    get_user_model().objects.create_user("alice", password="pw-x-123456")
    response = client.post(reverse("portal:login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200  # the form again
    assert SIGNED_IN_AS.format("") not in client.get("/").content.decode()


def test_local_login_is_absent_when_disabled(client: Client, settings) -> None:
    settings.LOCAL_LOGIN_ENABLED = False
    assert client.get(reverse("portal:login")).status_code == 404
