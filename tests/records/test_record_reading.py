"""Reading records: who sees which, the search filters, and putting a streamed answer back
together (on the simulator's real SSE output, and on the shapes it does not produce)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import orjson
import pytest

from governance.roles import Role
from records.models import GuardrailFinding, InteractionRecord
from records.reading import (
    RecordFilter,
    RecordSearchForm,
    assemble_stream,
    records_search,
    records_visible_to,
)
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.records import BASE_TIME, make_record, sse_response


# --- the assembler ---------------------------------------------------------------------------
def test_a_streamed_answer_from_the_simulator_assembles_to_its_plain_answer(
    start_simulator: Any,
) -> None:
    """GIVEN the simulator (the same prompt always gets the same answer)
    WHEN one chat is asked plainly and streamed
    THEN the streamed SSE bytes, assembled, are the plain answer's text and finish reason."""
    replica = start_simulator("sim-chat", "--time-scale", "0")
    body = {
        "model": "sim-chat",
        "messages": [{"role": "user", "content": "Tell me about trains."}],
        "max_tokens": 40,
    }
    plain = httpx.post(f"{replica.base_url}/v1/chat/completions", json=body, timeout=10)
    assert plain.status_code == 200, plain.text
    with httpx.stream(
        "POST",
        f"{replica.base_url}/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=10,
    ) as streamed:
        raw = b"".join(streamed.iter_raw())
    answer = plain.json()["choices"][0]

    assembled = assemble_stream(raw)

    assert assembled.done
    assert assembled.chunks > 3
    assert [c.index for c in assembled.choices] == [0]
    assert assembled.choices[0].role == "assistant"
    assert assembled.choices[0].text == answer["message"]["content"]
    assert assembled.choices[0].text  # not vacuous
    assert assembled.choices[0].finish_reason == answer["finish_reason"]
    assert assembled.usage is not None
    assert assembled.usage["completion_tokens"] == plain.json()["usage"]["completion_tokens"]


def test_tool_call_deltas_merge_by_index_and_arguments_concatenate() -> None:
    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(chunk) + b"\r\n\r\n"

    raw = b"".join(
        [
            event({"role": "assistant", "content": None}),
            event(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            event({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            event(
                {
                    "tool_calls": [
                        {"index": 1, "id": "call_b", "function": {"name": "now", "arguments": "{}"}}
                    ]
                }
            ),
            event({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
            event({}, finish="tool_calls"),
            b"data: [DONE]\r\n\r\n",
        ]
    )

    assembled = assemble_stream(raw)

    (choice,) = assembled.choices
    assert choice.text == ""
    assert choice.finish_reason == "tool_calls"
    assert choice.tool_calls == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    assert assembled.done


def test_text_completions_several_choices_and_a_cut_off_stream() -> None:
    events = [
        {"choices": [{"index": 0, "text": "Hel"}, {"index": 1, "text": "Bon"}]},
        {"choices": [{"index": 1, "text": "jour", "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "text": "lo", "finish_reason": "length"}]},
    ]
    raw = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    raw += b'data: {"choices": [{"index": 0, "te'  # the capture limit cut it here

    assembled = assemble_stream(raw)

    assert [(c.index, c.text, c.finish_reason) for c in assembled.choices] == [
        (0, "Hello", "length"),
        (1, "Bonjour", "stop"),
    ]
    assert not assembled.done
    assert assembled.chunks == 3


def test_an_error_event_in_the_stream_is_reported() -> None:
    raw = sse_response("Partial ")[: -len(b"data: [DONE]\n\n")]
    raw += b'data: {"error": {"message": "upstream went away", "type": "server_error"}}\n\n'

    assembled = assemble_stream(raw)

    assert assembled.text == "Partial "
    assert assembled.error == "upstream went away"
    assert not assembled.done


# --- who sees what, and the search ----------------------------------------------------------
@pytest.fixture
def world() -> dict[str, Any]:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    open_case = make_use_case(acme, "chatbot", records_visible_to_developers=True)
    closed_case = make_use_case(acme, "hr-bot")
    globex_case = make_use_case(globex, "search", records_visible_to_developers=True)
    return {
        "acme": acme,
        "open": make_record(open_case),
        "closed": make_record(closed_case),
        "globex": make_record(globex_case),
        "users": {
            "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
            "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
            "olivia": make_user("olivia", Role.OFFICER),
            "audrey": make_user("audrey", Role.AUDITOR),
            "root": make_user("root", Role.ADMIN),
            "mallory": make_user("mallory"),
        },
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("persona", "sees"),
    [
        ("audrey", {"open", "closed", "globex"}),
        ("olivia", {"open", "closed", "globex"}),
        ("root", {"open", "closed", "globex"}),
        ("alice", {"open"}),  # her tenant, and only where the use case opens its records
        ("bob", {"globex"}),
        ("mallory", set()),
    ],
)
def test_who_reads_which_records(world: dict[str, Any], persona: str, sees: set[str]) -> None:
    ids = set(records_visible_to(world["users"][persona]).values_list("record_id", flat=True))
    assert ids == {world[name].record_id for name in sees}


def _search(user: Any, **params: Any) -> list[str]:
    form = RecordSearchForm(params, user=user)
    assert form.is_valid(), form.errors
    return list(records_search(user, form.record_filter()).values_list("record_id", flat=True))


@pytest.mark.django_db
def test_each_search_filter_narrows_to_what_matches() -> None:
    acme = make_tenant("acme")
    llama = make_model("llama")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    triage = make_use_case(make_tenant("globex"), "triage")
    key, _ = make_key(chatbot)
    audrey = make_user("audrey", Role.AUDITOR)
    old = make_record(chatbot, minutes=0, status=200, key_id=key.pk, request_id="r-old")
    refused = make_record(chatbot, minutes=10, status=429, model="qwen")
    failed = make_record(triage, minutes=20, status=503)
    newest = make_record(triage, minutes=30, status=200)
    GuardrailFinding.objects.create(
        stream_id="1-0",
        request_id=failed.request_id,
        record_id=failed.record_id,
        occurred_at=failed.occurred_at,
        tenant="globex",
        use_case_id=triage.pk,
        model="llama",
        stage="request",
        guardrail="pii",
        action="redacted",
    )

    assert _search(audrey) == [newest.record_id, failed.record_id, refused.record_id, old.record_id]
    assert _search(audrey, tenant="acme") == [refused.record_id, old.record_id]
    assert _search(audrey, use_case=triage.pk) == [newest.record_id, failed.record_id]
    assert _search(audrey, key=str(key.pk)) == [old.record_id]
    assert _search(audrey, key=key.prefix[:8]) == [old.record_id]
    assert _search(audrey, model="qwen") == [refused.record_id]
    assert _search(audrey, status="429") == [refused.record_id]
    assert _search(audrey, status="5xx") == [failed.record_id]
    assert _search(audrey, status="2XX") == [newest.record_id, old.record_id]
    assert _search(audrey, guardrail="pii") == [failed.record_id]
    assert _search(audrey, guardrail_action="redacted") == [failed.record_id]
    assert _search(audrey, guardrail="pii", guardrail_action="blocked") == []
    assert _search(audrey, request_id="r-old") == [old.record_id]
    assert _search(audrey, record_id=refused.record_id) == [refused.record_id]
    since = (BASE_TIME + timedelta(minutes=10)).isoformat()
    until = (BASE_TIME + timedelta(minutes=30)).isoformat()
    assert _search(audrey, since=since, until=until) == [failed.record_id, refused.record_id]
    # a browser's datetime-local value is read as UTC
    assert _search(audrey, since="2026-03-02T10:25") == [newest.record_id]
    assert _search(audrey, content="stored") == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "4x"}, "status"),
        ({"status": "600"}, "status"),
        ({"tenant": "globex"}, "tenant"),  # alice's scope has no globex: as for "nosuch"
        ({"tenant": "nosuch"}, "tenant"),
        ({"use_case": "99999999999999999999999"}, "use_case"),
        ({"key": "sk-'; drop"}, "key"),
        ({"since": "2026-03-02T12:00", "until": "2026-03-02T11:00"}, "until"),
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
        ({"guardrail_action": "ignored"}, "guardrail_action"),
    ],
)
def test_a_bad_search_names_its_field(params: dict[str, str], field: str) -> None:
    acme = make_tenant("acme")
    make_tenant("globex")
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_use_case(acme, "chatbot", records_visible_to_developers=True)
    form = RecordSearchForm(params, user=alice)
    assert not form.is_valid()
    assert field in form.errors


@pytest.mark.django_db
def test_a_filter_describes_only_what_was_set() -> None:
    acme = make_tenant("acme")
    assert RecordFilter(tenant=acme, status="4xx").describe() == {"tenant": "acme", "status": "4xx"}
    assert InteractionRecord.objects.count() == 0
