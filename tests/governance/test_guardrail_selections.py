"""Officers choose a use case's guardrails: validated against the catalogue and the registered
models, stored with complete settings, in order, audited, and published to the gateway.

olivia is an officer, alice a developer of acme, audrey an auditor.
"""

from __future__ import annotations

import orjson
import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from gateway.policy import SNAPSHOT_KEY
from governance.audit import Actor, audit_verify
from governance.models import AuditEvent, GuardrailSelection
from governance.roles import Role
from governance.services.guardrail_selections import (
    guardrail_add,
    guardrail_change,
    guardrail_remove,
    guardrail_reorder,
    use_case_set_guardrail_failure,
)
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(company_guardrails):
    acme = make_tenant("acme")
    llama = make_model("llama")
    people = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
    }
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    actors = {name: Actor.for_user(user) for name, user in people.items()}
    return {"chatbot": chatbot, "llama": llama, **actors}


def add(world, guardrail="wordlist", side="both", action="redact", config=None, **extra):
    return guardrail_add(
        actor=world["olivia"],
        use_case=world["chatbot"],
        guardrail=guardrail,
        side=side,
        action=action,
        config={"words": ["project falcon"]} if config is None else config,
        **extra,
    )


def published_use_case(valkey_client, use_case) -> dict:
    document = orjson.loads(valkey_client.get(SNAPSHOT_KEY))
    return document["use_cases"][str(use_case.pk)]


def test_an_officer_selects_a_company_guardrail_and_the_gateway_gets_its_full_settings(
    world, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    """GIVEN a company detector in the catalogue WHEN olivia selects it THEN its settings are
    stored complete (defaults filled), the change is audited, and the snapshot carries it."""
    with django_capture_on_commit_callbacks(execute=True):
        selection = add(world)

    assert selection.config == {"words": ["project falcon"], "case_sensitive": False}
    event = AuditEvent.objects.get(action="guardrailselection.create")
    assert event.actor == "olivia"
    assert event.after is not None
    assert event.after["guardrail"] == "wordlist"
    assert event.after["config"] == {"words": ["project falcon"], "case_sensitive": False}
    assert audit_verify().ok
    entry = published_use_case(valkey_client, world["chatbot"])
    assert entry["guardrails"] == [
        {
            "guardrail": "wordlist",
            "side": "both",
            "action": "redact",
            "config": {"words": ["project falcon"], "case_sensitive": False},
        }
    ]
    assert entry["guardrail_failure"] == "closed"


@pytest.mark.parametrize("who", ["alice", "audrey"])
def test_only_officers_choose_guardrails(world, who) -> None:
    selection = add(world)
    with pytest.raises(PermissionDenied):
        guardrail_add(
            actor=world[who],
            use_case=world["chatbot"],
            guardrail="prompt_length",
            side="request",
            action="block",
            config={},
        )
    with pytest.raises(PermissionDenied):
        guardrail_change(actor=world[who], selection=selection, changes={"action": "flag"})
    with pytest.raises(PermissionDenied):
        guardrail_remove(actor=world[who], selection=selection)
    with pytest.raises(PermissionDenied):
        guardrail_reorder(actor=world[who], use_case=world["chatbot"], order=[selection.pk])
    with pytest.raises(PermissionDenied):
        use_case_set_guardrail_failure(actor=world[who], use_case=world["chatbot"], mode="open")
    assert GuardrailSelection.objects.get().action == "redact"


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"guardrail": "no_such_thing"}, "guardrail", "Unknown guardrail 'no_such_thing'"),
        ({"side": "sideways"}, "side", "Choose one of request, response, both"),
        (
            {"guardrail": "prompt_length", "side": "response", "action": "block", "config": {}},
            "side",
            "runs on request only",
        ),
        ({"action": "shout"}, "action", "Choose one of block, redact, flag"),
        (
            {"guardrail": "prompt_length", "side": "request", "config": {}},
            "action",
            "cannot redact",
        ),
        ({"config": ["words"]}, "config", "Give a JSON object"),
        ({"config": {"words": []}}, "config", "words: give a non-empty list"),
        ({"config": {"words": ["x"], "colour": "red"}}, "config", "colour: not a setting"),
        (
            {
                "guardrail": "prompt_length",
                "side": "request",
                "action": "block",
                "config": {"max_chars": 0},
            },
            "config",
            "max_chars",
        ),
        ({"position": 5}, "position", "Choose a position from 0 to 0"),
    ],
)
def test_each_bad_selection_is_refused_naming_its_field(world, kwargs, field, words) -> None:
    with pytest.raises(ValidationError) as refused:
        add(world, **kwargs)
    assert words in " ".join(refused.value.message_dict[field])
    assert not GuardrailSelection.objects.exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_a_guardrail_is_selected_once_per_stage(world) -> None:
    add(world, side="request")
    with pytest.raises(ValidationError) as refused:
        add(world, side="both")
    assert "already selected on request" in refused.value.message_dict["guardrail"][0]
    # The other stage is free.
    assert add(world, side="response").side == "response"


@pytest.mark.parametrize(
    ("guardrail", "side", "config", "words"),
    [
        ("banned_topics", "request", {"topics": []}, "name the guard model"),
        ("banned_topics", "request", {"model": "nobody"}, "no registered model is called"),
        ("banned_topics", "request", {"model": "llama"}, "lacks the 'guard' capability"),
        ("groundedness", "response", {"model": "llama"}, "lacks the 'embeddings' capability"),
        (
            "banned_topics",
            "request",
            {"model": "guard-1b", "priority_class": "vip"},
            "no priority class is called 'vip'",
        ),
    ],
)
def test_a_fleet_guardrail_names_a_registered_model_with_the_right_capability(
    world, guardrail, side, config, words
) -> None:
    make_model("guard-1b", capabilities=["guard"])
    with pytest.raises(ValidationError) as refused:
        add(world, guardrail=guardrail, side=side, action="block", config=config)
    assert words in refused.value.message_dict["config"][0]


@pytest.mark.django_db(transaction=True)
def test_selections_run_in_the_order_the_officer_sets(
    world, live_valkey_settings, valkey_client
) -> None:
    """GIVEN two selections WHEN olivia reorders them THEN the committed change republishes
    the snapshot with them in the new order."""
    words = add(world)
    length = add(world, guardrail="prompt_length", side="request", action="block", config={})
    assert (words.position, length.position) == (0, 1)

    guardrail_reorder(actor=world["olivia"], use_case=world["chatbot"], order=[length.pk, words.pk])

    entry = published_use_case(valkey_client, world["chatbot"])
    assert [g["guardrail"] for g in entry["guardrails"]] == ["prompt_length", "wordlist"]
    assert entry["guardrails"][0]["config"] == {"max_chars": 4000}
    event = AuditEvent.objects.get(action="usecase.guardrails_reorder")
    assert event.before == {"guardrails": ["wordlist:both", "prompt_length:request"]}
    assert event.after == {"guardrails": ["prompt_length:request", "wordlist:both"]}


def test_an_insert_at_a_position_moves_the_others_down(world) -> None:
    words = add(world)
    length = add(
        world, guardrail="prompt_length", side="request", action="flag", config={}, position=0
    )
    words.refresh_from_db()
    assert (length.position, words.position) == (0, 1)


@pytest.mark.parametrize(
    ("order", "words"),
    [
        (lambda a, b: [a], "are missing"),
        (lambda a, b: [a, b, 999], "are not this use case's"),
        (lambda a, b: [a, a, b], "Name each selection once"),
    ],
)
def test_a_reorder_must_name_every_selection_once(world, order, words) -> None:
    first = add(world)
    second = add(world, guardrail="prompt_length", side="request", action="flag", config={})
    with pytest.raises(ValidationError) as refused:
        guardrail_reorder(
            actor=world["olivia"], use_case=world["chatbot"], order=order(first.pk, second.pk)
        )
    assert words in refused.value.message_dict["order"][0]


def test_changing_and_removing_a_selection_is_validated_audited_and_renumbered(world) -> None:
    words = add(world)
    length = add(world, guardrail="prompt_length", side="request", action="flag", config={})

    with pytest.raises(ValidationError) as refused:
        guardrail_change(
            actor=world["olivia"], selection=length, changes={"config": {"max_chars": "lots"}}
        )
    assert "max_chars" in refused.value.message_dict["config"][0]

    guardrail_change(
        actor=world["olivia"],
        selection=GuardrailSelection.objects.get(pk=words.pk),
        changes={"action": "block", "config": {"words": ["falcon"], "case_sensitive": True}},
    )
    update = AuditEvent.objects.get(action="guardrailselection.update")
    assert update.before is not None
    assert update.after is not None
    assert update.before["action"] == "redact"
    assert update.after["action"] == "block"
    assert update.after["config"] == {"words": ["falcon"], "case_sensitive": True}

    guardrail_remove(actor=world["olivia"], selection=GuardrailSelection.objects.get(pk=words.pk))
    assert AuditEvent.objects.filter(action="guardrailselection.delete").count() == 1
    assert GuardrailSelection.objects.get().position == 0


@pytest.mark.django_db(transaction=True)
def test_fail_open_or_closed_is_the_officers_choice_and_reaches_the_gateway(
    world, live_valkey_settings, valkey_client
) -> None:
    with pytest.raises(ValidationError) as refused:
        use_case_set_guardrail_failure(
            actor=world["olivia"], use_case=world["chatbot"], mode="ajar"
        )
    assert "closed, open" in refused.value.message_dict["guardrail_failure"][0]

    use_case_set_guardrail_failure(actor=world["olivia"], use_case=world["chatbot"], mode="open")

    assert published_use_case(valkey_client, world["chatbot"])["guardrail_failure"] == "open"
    event = AuditEvent.objects.get(action="usecase.update")
    assert event.before is not None
    assert event.after is not None
    assert (event.before["guardrail_failure"], event.after["guardrail_failure"]) == (
        "closed",
        "open",
    )


def test_a_guard_model_in_use_keeps_its_name_capability_and_existence(world) -> None:
    """GIVEN a guardrail that asks guard-1b for verdicts WHEN an officer would delete the
    model, rename it or drop its guard capability THEN each is refused naming the use case."""
    from governance.errors import Conflict
    from governance.services.generic_records import record_delete, record_update

    guard = make_model("guard-1b", capabilities=["guard"])
    GuardrailSelection.objects.create(
        use_case=world["chatbot"],
        guardrail="banned_topics",
        side="request",
        action="block",
        config={"model": "guard-1b", "topics": []},
    )
    with pytest.raises(Conflict, match=r"acme/chatbot \(banned_topics\)"):
        record_delete(actor=world["olivia"], instance=guard)
    with pytest.raises(ValidationError) as renamed:
        record_update(actor=world["olivia"], instance=guard, changes={"public_id": "guard-2"})
    assert "acme/chatbot" in renamed.value.message_dict["public_id"][0]
    guard.refresh_from_db()
    with pytest.raises(ValidationError) as dropped:
        record_update(actor=world["olivia"], instance=guard, changes={"capabilities": ["chat"]})
    assert "'guard' is needed" in dropped.value.message_dict["capabilities"][0]
    # A model nothing asks is the officer's to change.
    record_update(actor=world["olivia"], instance=world["llama"], changes={"public_id": "llama-2"})


def test_the_migration_numbers_existing_selections_in_their_old_listed_order(world) -> None:
    """GIVEN selections made before positions existed (all at 0) WHEN the migration's data
    step runs THEN each use case's run in the order they were listed: by side, then name."""
    import importlib

    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    migration = importlib.import_module("governance.migrations.0007_guardrail_selection_governance")
    chatbot = world["chatbot"]
    other = make_use_case(chatbot.tenant, "triage")
    for use_case, guardrail, side in [
        (chatbot, "wordlist", "response"),
        (chatbot, "prompt_length", "request"),
        (chatbot, "wordlist", "request"),
        (other, "wordlist", "request"),
    ]:
        GuardrailSelection.objects.create(
            use_case=use_case, guardrail=guardrail, side=side, action="flag", position=0
        )

    state = MigrationLoader(connection).project_state(
        ("governance", "0007_guardrail_selection_governance")
    )
    migration.number_positions(state.apps, None)  # a data step: it needs no schema editor

    def order(use_case):
        rows = GuardrailSelection.objects.filter(use_case=use_case).order_by("position")
        return [(g.side, g.guardrail, g.position) for g in rows]

    assert order(chatbot) == [
        ("request", "prompt_length", 0),
        ("request", "wordlist", 1),
        ("response", "wordlist", 2),
    ]
    assert order(other) == [("request", "wordlist", 0)]
