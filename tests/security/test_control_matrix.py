"""The control matrix of docs/security.md, proved: every control at every door (issue 24).

Two parts:

- ``test_the_table_and_the_suite_agree`` reads the table in docs/security.md and fails when
  it and the tests disagree: an ``enforced`` cell must name tests that exist (pytest collects
  them), every cell this module runs must be in the table as enforced by it, and an ``n/a``
  cell must say why.
- ``test_control_at_door[<door>-<control>]`` runs the cells this module owns — the gateway's
  doors — against real processes started once for the module (testkit/module_stack.py):
  Valkey, the vLLM simulator (a chat, an embedding and a speech model), the guardrail service
  with the test detectors, a fleet watcher, a gateway and a batcher. One request (two for a
  rate limit: one that passes, one that does not) per cell.

Each cell has a use case of its own, with one key, so that no cell's limit, guardrail or record
policy reaches another's. The global rate limits apply to everyone on a Valkey, so their cells
run on a second, smaller stack (its own Valkey and gateway in front of the same replicas).
Cells the gateway cannot tell apart (a suspended and a retired use case are both left out of
the snapshot by governance) are each run, and ``test_governance_leaves_a_stopped_use_case_out``
proves the governance half against the database.
"""

from __future__ import annotations

import functools
import importlib
import io
import re
import subprocess
import sys
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import RECORDS_STREAM, USAGE_STREAM
from gateway.policy import RecordPolicy
from governance.audit import Actor
from governance.models import PriorityClass, SlaClass
from governance.roles import Role
from governance.services.use_cases import use_case_transition
from governance.snapshot import snapshot_build
from ops.processes import PYTHON, wait_until
from simulator.transcriptions import audio_duration, transcript
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.module_stack import ModuleStack, module_stack
from testkit.policy import PolicyBuilder

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "security.md"
HERE = "tests/security/test_control_matrix.py"

# --- the table's vocabulary: doors (columns) and controls (rows) ------------------------------
DOORS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "transcriptions": "/v1/audio/transcriptions",
    "async": "/v1/async/*",
    "files-batches": "OpenAI Files and Batches",
    "file-jobs": "file jobs",
    "playground": "portal playground",
    "web-api": "web /api/ with an API key",
}
LEVELS = {
    "global": "global",
    "model": "model",
    "tenant": "tenant",
    "tenant-model": "tenant × model",
    "use-case": "use case",
}
CONTROLS: dict[str, str] = {
    "key-revoked": "key revoked",
    "key-expired": "key expired",
    "use-case-suspended": "use case suspended",
    "use-case-retired": "use case retired",
    "model-not-allowed": "model not allowed",
    "model-sunset": "model past its sunset",
    "model-version-not-allowed": "model not allowed, named by version or alias",
    "max-tokens-cap": "max_tokens cap",
    "n-cap": "n cap",
    **{f"rpm-{level}": f"requests/min, {words}" for level, words in LEVELS.items()},
    **{f"tpm-{level}": f"tokens/min, {words}" for level, words in LEVELS.items()},
    "request-guardrail-block": "request guardrails: block",
    "request-guardrail-redact": "request guardrails: redact",
    "response-guardrails": "response guardrails",
    "record-none": "record policy none",
    "record-metadata": "record policy metadata",
    "record-full": "record policy full",
    "read-audit": "audit of reads and downloads",
}

# --- reading the table ---------------------------------------------------------------------------
_TEST_REF = re.compile(r"`(tests/[\w/]+\.py::[^`]+)`")


@dataclass(frozen=True)
class TableCell:
    door: str
    control: str
    text: str

    @property
    def verdict(self) -> str:
        return self.text.split(":", 1)[0].strip()

    @property
    def reason(self) -> str:
        return self.text.split(":", 1)[1].strip() if ":" in self.text else ""

    @property
    def tests(self) -> list[str]:
        return _TEST_REF.findall(self.text)


def _row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _plain(text: str) -> str:
    return text.replace("`", "").strip()


def read_table(markdown: str) -> dict[tuple[str, str], TableCell]:
    """The matrix: the markdown table whose header names the doors, by (door, control)."""
    lines = markdown.splitlines()
    doors_by_header = {header: door for door, header in DOORS.items()}
    controls_by_label = {label: control for control, label in CONTROLS.items()}
    starts = [
        number
        for number, line in enumerate(lines)
        if line.startswith("|")
        and len(_row(line)) > 2
        and all(_plain(h) in doors_by_header for h in _row(line)[1:])
    ]
    assert starts, f"{TABLE} has no table whose columns are the doors"
    start = starts[0]
    header = _row(lines[start])
    doors = [doors_by_header[_plain(h)] for h in header[1:]]
    cells: dict[tuple[str, str], TableCell] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = _row(line)
        label = _plain(row[0])
        assert label in controls_by_label, f"unknown control row {label!r}"
        assert len(row) == len(doors) + 1, f"row {label!r} has {len(row) - 1} cells"
        control = controls_by_label[label]
        for door, text in zip(doors, row[1:], strict=True):
            cells[door, control] = TableCell(door, control, text)
    return cells


# --- the stack -----------------------------------------------------------------------------------
CHAT = "llama"  # chat and completions
EMBED = "embed"
WHISPER = "whisper"
CAPPED = "llama-capped"  # the officer's max_tokens cap: CAP completion tokens
CAP = 5
BASE = {
    "chat": CHAT,
    "completions": CHAT,
    "embeddings": EMBED,
    "transcriptions": WHISPER,
    "async": CHAT,
}
CAPABILITIES: dict[str, tuple[Any, ...]] = {
    CHAT: ("chat", "completions"),
    EMBED: ("embeddings",),
    WHISPER: ("transcription",),
}
GATEWAY_DOORS = ("chat", "completions", "embeddings", "transcriptions", "async")
GENERATING = ("chat", "completions", "async")
SYNC = ("chat", "completions", "embeddings", "transcriptions")
SECRET: dict[str, object] = {"words": ["secret"]}
TOKEN_LIMIT = 1_000  # every tokens/min cell's limit


def wav(seconds: float, rate: int = 8_000) -> bytes:
    """A real WAV file (mono, 16-bit silence)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(rate * seconds)))
    return buffer.getvalue()


SHORT_AUDIO = wav(1)  # 50 audio tokens
LONG_AUDIO = wav(25)  # 1,250 audio tokens: more than TOKEN_LIMIT


def first_spoken_word(audio: bytes) -> str:
    """The first word the simulator's speech model hears in ``audio`` (it is deterministic)."""
    return re.findall(r"[a-z]+", transcript(audio, audio_duration(audio)).lower())[0]


@dataclass
class Cell:
    """One cell of the suite: its door, its use case's key, and the model it calls."""

    door: str
    control: str
    key: str = ""
    model: str = ""
    tenant: str = ""


@dataclass
class World:
    url: str
    everyone_url: str  # the stack whose global limits bind everyone
    valkey: valkey.Valkey
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def cell(self, door: str, control: str) -> Cell:
        return self.cells[door, control]


def body_for(
    door: str, model: str, text: str = "Say something short.", **extra: Any
) -> dict[str, Any]:
    """The JSON body of a small request at a door (async: an async chat)."""
    if door in ("chat", "async"):
        return {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 4,
            **extra,
        }
    if door == "completions":
        return {"model": model, "prompt": text, "max_tokens": 4, **extra}
    if door == "embeddings":
        return {"model": model, "input": text, **extra}
    raise AssertionError(door)


PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "transcriptions": "/v1/audio/transcriptions",
    "async": "/v1/async/chat/completions",
}


def send(
    base_url: str,
    door: str,
    key: str,
    model: str,
    *,
    text: str = "Say something short.",
    audio: bytes = SHORT_AUDIO,
    **extra: Any,
) -> httpx.Response:
    """One request at ``door`` with ``key``: a JSON body, or (transcriptions) an upload whose
    ``prompt`` field is ``text``."""
    headers = {"authorization": f"Bearer {key}"}
    if door == "transcriptions":
        fields = {"model": model, "prompt": text, **{k: str(v) for k, v in extra.items()}}
        return httpx.post(
            base_url + PATHS[door],
            files={"file": ("call.wav", audio, "audio/wav")},
            data=fields,
            headers=headers,
            timeout=30,
        )
    return httpx.post(
        base_url + PATHS[door],
        content=orjson.dumps(body_for(door, model, text, **extra)),
        headers={**headers, "content-type": "application/json"},
        timeout=30,
    )


def accepted(door: str, response: httpx.Response) -> None:
    assert response.status_code == (202 if door == "async" else 200), response.text


def refused(response: httpx.Response, status: int, code: str, *, kind: str | None = None) -> Any:
    """An OpenAI-shaped refusal with this status and code; its ``error`` object."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == code, error
    if kind is not None:
        assert error["type"] == kind, error
    return error


def finished_task(world: World, key: str, submitted: httpx.Response) -> dict[str, Any]:
    """An async task once it has ended: the poll's document."""
    assert submitted.status_code == 202, submitted.text
    task_id = submitted.json()["id"]
    ended: dict[str, Any] = {}

    def done() -> bool:
        polled = httpx.get(
            f"{world.url}/v1/tasks/{task_id}?wait=5",
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert polled.status_code == 200, polled.text
        ended.update(polled.json())
        return ended["status"] in ("done", "failed", "expired")

    assert wait_until(done, timeout=60), ended
    assert ended["status"] == "done", ended
    result: dict[str, Any] = ended["result"]
    return result


def stream_entry(client: valkey.Valkey, stream: str, record_id: str) -> dict[str, bytes] | None:
    for _, fields in client.xrange(stream):
        if fields.get(b"record_id") == record_id.encode():
            return {k.decode(): v for k, v in fields.items()}
    return None


def usage_of(client: valkey.Valkey, record_id: str) -> dict[str, bytes]:
    """The request's usage entry, once written (a full record's transcript goes before it)."""
    assert wait_until(lambda: stream_entry(client, USAGE_STREAM, record_id) is not None), (
        f"no usage entry for {record_id}"
    )
    found = stream_entry(client, USAGE_STREAM, record_id)
    assert found is not None
    return found


# --- the controls, each: how its cells' use case is set up, and the check ------------------------
Setup = Callable[[PolicyBuilder, Cell], None]
Check = Callable[[World, Cell], None]


@dataclass(frozen=True)
class Control:
    doors: tuple[str, ...]
    setup: Setup
    check: Check
    everyone: bool = False  # set up on the stack of the global limits


OWNED: dict[str, Control] = {}


def control(
    name: str, doors: tuple[str, ...], setup: Setup, *, everyone: bool = False
) -> Callable[[Check], Check]:
    assert name in CONTROLS, name

    def register(check: Check) -> Check:
        OWNED[name] = Control(doors, setup, check, everyone)
        return check

    return register


def plain_key(policy: PolicyBuilder, cell: Cell) -> None:
    cell.key = policy.key(
        tenant=cell.tenant or "acme",
        use_case=f"{cell.door}-{cell.control}",
        priority_class="prod",
    )


# Stopped once the stack runs (``stop_after_start``): each key is seen to work first.
STOPPED_AFTER_START = ("key-revoked", "use-case-suspended", "use-case-retired")


def _refused_as_unknown_key(world: World, cell: Cell) -> None:
    response = send(world.url, cell.door, cell.key, cell.model)
    error = refused(response, 401, "invalid_api_key", kind="invalid_request_error")
    assert error["message"] == "Incorrect API key provided."


@control("key-revoked", GATEWAY_DOORS, plain_key)
def key_revoked(world: World, cell: Cell) -> None:
    """GIVEN a key that worked WHEN it is revoked THEN 401 at the door, nothing forwarded."""
    _refused_as_unknown_key(world, cell)


def expired_key(policy: PolicyBuilder, cell: Cell) -> None:
    cell.key = policy.key(
        use_case=f"{cell.door}-{cell.control}", expires_at=time.time() - 60, priority_class="prod"
    )


@control("key-expired", GATEWAY_DOORS, expired_key)
def key_expired(world: World, cell: Cell) -> None:
    """The gateway checks the expiry on its own clock, whatever the snapshot still holds."""
    _refused_as_unknown_key(world, cell)


@control("use-case-suspended", GATEWAY_DOORS, plain_key)
def use_case_suspended(world: World, cell: Cell) -> None:
    _refused_as_unknown_key(world, cell)


@control("use-case-retired", GATEWAY_DOORS, plain_key)
def use_case_retired(world: World, cell: Cell) -> None:
    _refused_as_unknown_key(world, cell)


def other_models_only(policy: PolicyBuilder, cell: Cell) -> None:
    """The cell's model exists, but the use case is approved for every model except it."""
    base = cell.model
    cell.model = f"{base}-{cell.door}-not-allowed"
    policy.model(cell.model, list(policy.models[base]["replicas"]), served_name=base,
                 capabilities=CAPABILITIES[base])  # fmt: skip
    allowed = [name for name in policy.models if name != cell.model]
    cell.key = policy.key(
        use_case=f"{cell.door}-{cell.control}", models=allowed, priority_class="prod"
    )


@control("model-not-allowed", GATEWAY_DOORS, other_models_only)
def model_not_allowed(world: World, cell: Cell) -> None:
    response = send(world.url, cell.door, cell.key, cell.model)
    error = refused(response, 403, "model_not_allowed", kind="permission_error")
    assert error["param"] == "model"


def other_versioned_models_only(policy: PolicyBuilder, cell: Cell) -> None:
    """The cell's model has versions (both on the base model's replicas) and an alias; the
    key may call every other model."""
    base = cell.model
    cell.model = f"{base}-{cell.door}-versioned"
    replicas = list(policy.models[base]["replicas"])
    policy.versions(cell.model, {"v1": replicas, "v2": replicas}, aliases={"stable": "v1"},
                    served_name=base, capabilities=CAPABILITIES[base])  # fmt: skip
    allowed = [name for name in policy.models if name.partition("@")[0] != cell.model]
    cell.key = policy.key(
        use_case=f"{cell.door}-{cell.control}", models=allowed, priority_class="prod"
    )


@control("model-version-not-allowed", GATEWAY_DOORS, other_versioned_models_only)
def model_version_not_allowed(world: World, cell: Cell) -> None:
    """GIVEN a model with versions the use case may not call WHEN a request names one of
    its versions or an alias THEN it is refused as the model itself is: the grant is the
    model's, whatever name reaches it."""
    for name in (f"{cell.model}@v1", f"{cell.model}@stable", cell.model):
        response = send(world.url, cell.door, cell.key, name)
        error = refused(response, 403, "model_not_allowed", kind="permission_error")
        assert error["param"] == "model"


def sunset_model(policy: PolicyBuilder, cell: Cell) -> None:
    """The cell's model, deprecated for the base model and past its sunset (refused there)."""
    base = cell.model
    cell.model = f"{base}-{cell.door}-sunset"
    policy.model(cell.model, list(policy.models[base]["replicas"]), served_name=base,
                 capabilities=CAPABILITIES[base])  # fmt: skip
    policy.lifecycle(cell.model, sunset_at=time.time() - 60, successor=base)
    plain_key(policy, cell)


@control("model-sunset", GATEWAY_DOORS, sunset_model)
def model_sunset(world: World, cell: Cell) -> None:
    """GIVEN a model deprecated for its successor WHEN its sunset has passed THEN every door
    answers 410 naming the successor (docs/models.md), by the gateway's clock."""
    response = send(world.url, cell.door, cell.key, cell.model)
    error = refused(response, 410, "model_retired", kind="invalid_request_error")
    assert error["param"] == "model"
    assert f"Use '{BASE[cell.door]}' instead." in error["message"]


def capped_key(policy: PolicyBuilder, cell: Cell) -> None:
    cell.model = CAPPED
    plain_key(policy, cell)
    # One choice fits; forty never do: n counts in the estimate (gateway/costs.py).
    policy.use_case_limits(cell.key, tokens_per_minute=100)


def _answer(world: World, cell: Cell, response: httpx.Response) -> dict[str, Any]:
    """The answer of a sync request, or of an async task once the batcher has run it."""
    accepted(cell.door, response)
    if cell.door == "async":
        return finished_task(world, cell.key, response)
    answer: dict[str, Any] = response.json()
    return answer


@control("max-tokens-cap", GENERATING, capped_key)
def max_tokens_cap(world: World, cell: Cell) -> None:
    """GIVEN a model capped at CAP completion tokens WHEN a client asks for 50 (the simulator
    generates to the bound it gets, ``ignore_eos``) THEN CAP tokens come back."""
    response = send(world.url, cell.door, cell.key, CAPPED, max_tokens=50, ignore_eos=True)
    answer = _answer(world, cell, response)
    assert answer["usage"]["completion_tokens"] == CAP, answer


@control("n-cap", GENERATING, capped_key)
def n_cap(world: World, cell: Cell) -> None:
    """Every one of ``n`` choices is held to the cap, and ``n`` multiplies the estimate: 40
    choices of CAP tokens are more than the use case's 100 tokens a minute."""
    response = send(world.url, cell.door, cell.key, CAPPED, max_tokens=50, n=3, ignore_eos=True)
    answer = _answer(world, cell, response)
    assert len(answer["choices"]) == 3, answer
    assert answer["usage"]["completion_tokens"] == 3 * CAP, answer
    many = send(world.url, cell.door, cell.key, CAPPED, max_tokens=50, n=40)
    error = refused(many, 429, "rate_limit_exceeded", kind="rate_limit_error")
    assert "larger than the limit" in error["message"]


# Rate limits: one rule per cell, on a model, a tenant or a use case of the cell's own.
def limited(level: str, kind: str) -> Setup:
    def setup(policy: PolicyBuilder, cell: Cell) -> None:
        rpm, tpm = (1, None) if kind == "rpm" else (None, TOKEN_LIMIT)
        if level in ("model", "tenant-model"):
            base = cell.model
            cell.model = f"{base}-{cell.door}-{cell.control}"
            policy.model(cell.model, list(policy.models[base]["replicas"]), served_name=base,
                         capabilities=CAPABILITIES[base])  # fmt: skip
        if level in ("tenant", "tenant-model"):
            cell.tenant = f"t-{cell.door}-{cell.control}"
        plain_key(policy, cell)
        name = f"{cell.door}-{cell.control}"
        if level == "model":
            policy.rate_limit(
                name, "model", model=cell.model, requests_per_minute=rpm, tokens_per_minute=tpm
            )
        elif level == "tenant":
            policy.rate_limit(
                name, "tenant", tenant=cell.tenant, requests_per_minute=rpm, tokens_per_minute=tpm
            )
        elif level == "tenant-model":
            policy.rate_limit(
                name,
                "tenant_model",
                tenant=cell.tenant,
                model=cell.model,
                requests_per_minute=rpm,
                tokens_per_minute=tpm,
            )
        elif level == "use-case":
            policy.use_case_limits(cell.key, requests_per_minute=rpm, tokens_per_minute=tpm)

    return setup


def limit_name(cell: Cell, level: str, kind: str) -> str:
    """The limit as the 429 names it (gateway/admission/limits.py)."""
    words = "requests per minute" if kind == "rpm" else "tokens per minute"
    who = {
        "global": "global",
        "model": f"model {cell.model}",
        "tenant": f"tenant {cell.tenant}",
        "tenant-model": f"tenant {cell.tenant} on model {cell.model}",
        "use-case": f"use case {cell.door}-{cell.control}",
    }[level]
    return f"{who} {words}"


def large(door: str) -> dict[str, Any]:
    """What makes a request at ``door`` cost more than TOKEN_LIMIT tokens."""
    if door == "embeddings":
        return {"text": "word " * TOKEN_LIMIT}
    if door == "transcriptions":
        return {"audio": LONG_AUDIO}
    return {"max_tokens": 2 * TOKEN_LIMIT}


def rate_check(level: str, kind: str) -> Check:
    def check(world: World, cell: Cell) -> None:
        url = world.everyone_url if level == "global" else world.url
        first = send(url, cell.door, cell.key, cell.model)
        if level != "global":  # (the global limits are everyone's: another cell may be first)
            accepted(cell.door, first)
        if kind == "rpm":
            second = send(url, cell.door, cell.key, cell.model)
            error = refused(second, 429, "rate_limit_exceeded", kind="rate_limit_error")
            assert int(second.headers["retry-after"]) >= 1
        else:
            second = send(url, cell.door, cell.key, cell.model, **large(cell.door))
            error = refused(second, 429, "rate_limit_exceeded", kind="rate_limit_error")
            assert "larger than the limit" in error["message"]
        assert f"Rate limit reached: {limit_name(cell, level, kind)}." in error["message"]

    return check


for _level in LEVELS:
    for _kind in ("rpm", "tpm"):
        control(
            f"{_kind}-{_level}",
            GATEWAY_DOORS,
            plain_key if _level == "global" else limited(_level, _kind),
            everyone=_level == "global",
        )(rate_check(_level, _kind))


def guarded(
    action: Literal["block", "redact"],
    side: Literal["request", "response"] = "request",
    words: list[str] | None = None,
    record: RecordPolicy | None = None,
) -> Setup:
    def setup(policy: PolicyBuilder, cell: Cell) -> None:
        plain_key(policy, cell)
        config: dict[str, object] = {"words": words} if words else SECRET
        policy.guardrail(cell.key, "words", side=side, action=action, config=config)
        if record is not None:
            policy.record(cell.key, record)

    return setup


@control("request-guardrail-block", GATEWAY_DOORS, guarded("block"))
def request_guardrail_block(world: World, cell: Cell) -> None:
    """GIVEN a use case that blocks "secret" on requests WHEN the word is in what the model
    would read THEN 400, nothing forwarded. A transcription's ``prompt`` is text the model
    reads (its audio is checked through the transcript, at the response stage)."""
    response = send(world.url, cell.door, cell.key, cell.model, text="tell me the secret")
    error = refused(response, 400, "guardrail_blocked", kind="invalid_request_error")
    assert error["message"] == "The request was blocked by the 'words' guardrail (WORD)."


ECHO = {"chat", "completions", "async"}


@control(
    "request-guardrail-redact",
    ("chat", "completions", "embeddings", "transcriptions", "async"),
    guarded("redact", record="full"),
)
def request_guardrail_redact(world: World, cell: Cell) -> None:
    """GIVEN redaction of "secret" on requests THEN the replica never reads the word: the
    simulator's echo of what it got (chat, completions, async) or the full record of the
    request as forwarded (embeddings) shows it redacted. A transcription's ``prompt`` is
    redacted or, unreadable audio beside it, the upload is refused."""
    text = "my secret plan"
    if cell.door in ECHO:
        extra: dict[str, Any] = {"echo": True, "max_tokens": 2}
        if cell.door == "completions":
            response = send(world.url, cell.door, cell.key, cell.model, text=text, **extra)
            said = response.json()["choices"][0]["text"]
        else:
            body = {
                "model": cell.model,
                "messages": [
                    {"role": "user", "content": "Repeat after me."},
                    {"role": "assistant", "content": text},
                ],
                **extra,
            }
            response = httpx.post(
                world.url + PATHS[cell.door],
                json=body,
                headers={"authorization": f"Bearer {cell.key}"},
                timeout=30,
            )
            answer = (
                finished_task(world, cell.key, response)
                if cell.door == "async"
                else response.json()
            )
            said = answer["choices"][0]["message"]["content"]
        accepted(cell.door, response)
        assert said.startswith("my <WORD> plan"), said
        return
    response = send(world.url, cell.door, cell.key, cell.model, text=text)
    if cell.door == "transcriptions" and response.status_code == 400:
        refused(response, 400, "unreadable_content")
        return
    accepted(cell.door, response)
    usage_of(world.valkey, response.headers["x-switchyard-record-id"])
    record = stream_entry(world.valkey, RECORDS_STREAM, response.headers["x-switchyard-record-id"])
    assert record is not None
    assert b"secret" not in record["request"], record["request"]
    assert b"<WORD>" in record["request"], record["request"]


SPOKEN = first_spoken_word(SHORT_AUDIO)


def answer_guarded(policy: PolicyBuilder, cell: Cell) -> None:
    words = [SPOKEN] if cell.door == "transcriptions" else None
    guarded("block", side="response", words=words)(policy, cell)


@control("response-guardrails", ("chat", "completions", "transcriptions"), answer_guarded)
def response_guardrails(world: World, cell: Cell) -> None:
    """GIVEN a use case that blocks "secret" in answers WHEN the answer says it (the
    simulator echoes the prompt, or a chat's last assistant message; a transcript says what
    the audio holds) THEN 422 naming the guardrail, and the client never reads the answer."""
    if cell.door == "completions":
        response = send(world.url, cell.door, cell.key, cell.model, text="the secret. ", echo=True)
    elif cell.door == "chat":
        response = httpx.post(
            world.url + PATHS["chat"],
            json={
                "model": cell.model,
                "echo": True,
                "max_tokens": 2,
                "messages": [
                    {"role": "user", "content": "Go on."},
                    {"role": "assistant", "content": "Here is the secret: "},
                ],
            },
            headers={"authorization": f"Bearer {cell.key}"},
            timeout=30,
        )
    else:
        response = send(world.url, cell.door, cell.key, cell.model, text="")
    error = refused(response, 422, "guardrail_blocked")
    assert "'words'" in error["message"]
    assert "response" in error["message"]


def recorded(policy_name: RecordPolicy) -> Setup:
    def setup(policy: PolicyBuilder, cell: Cell) -> None:
        plain_key(policy, cell)
        policy.record(cell.key, policy_name)

    return setup


def record_check(policy_name: RecordPolicy) -> Check:
    def check(world: World, cell: Cell) -> None:
        body = None if cell.door == "transcriptions" else body_for(cell.door, cell.model)
        response = send(world.url, cell.door, cell.key, cell.model)
        accepted(cell.door, response)
        record_id = response.headers["x-switchyard-record-id"]
        usage = usage_of(world.valkey, record_id)
        assert usage["record"] == policy_name.encode()
        assert usage["endpoint"] == PATHS[cell.door].encode()
        record = stream_entry(world.valkey, RECORDS_STREAM, record_id)
        if policy_name != "full":
            assert record is None, "content kept for a use case that keeps none"
            return
        assert record is not None
        assert record["response"] == response.content
        if body is None:
            assert orjson.loads(record["request"])["multipart"] is True
            assert SHORT_AUDIO[:64] not in record["request"]
        else:
            assert record["request"] == orjson.dumps(body)

    return check


_POLICIES: tuple[RecordPolicy, ...] = ("none", "metadata", "full")
for _policy in _POLICIES:
    control(f"record-{_policy}", SYNC, recorded(_policy))(record_check(_policy))


def own_cells() -> list[tuple[str, str]]:
    return [(door, name) for name, owned in OWNED.items() for door in owned.doors]


def cell_id(door: str, control_name: str) -> str:
    return f"{door}-{control_name}"


# --- the module's one stack ----------------------------------------------------------------------
def _works(url: str, key: str) -> bool:
    answer = httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10)
    return answer.status_code == 200


def _stopped(url: str, key: str) -> bool:
    return not _works(url, key)


def _base_models(policy: PolicyBuilder, replicas: dict[str, str]) -> None:
    for name, url in replicas.items():
        policy.model(name, [url], capabilities=CAPABILITIES[name])
    policy.model(CAPPED, [replicas[CHAT]], served_name=CHAT, max_tokens=CAP)
    policy.priority_class("prod", rank=0).priority_class("batch", rank=4)


def _start(stack: ModuleStack, everyone: ModuleStack) -> World:
    replicas = {
        CHAT: stack.simulator(CHAT, "--time-scale", "0"),
        EMBED: stack.simulator(EMBED, "--kind", "embedding", "--time-scale", "0"),
        WHISPER: stack.simulator(WHISPER, "--kind", "transcription", "--time-scale", "0"),
    }
    policy, global_policy = PolicyBuilder(), PolicyBuilder()
    _base_models(policy, replicas)
    _base_models(global_policy, replicas)
    # First the tokens, then the requests: a request too large for the first is refused by
    # it even when the one request a minute is taken.
    global_policy.rate_limit("everyone-tokens", "global", tokens_per_minute=TOKEN_LIMIT)
    global_policy.rate_limit("everyone-requests", "global", requests_per_minute=1)
    cells: dict[tuple[str, str], Cell] = {}
    for door, name in own_cells():
        owned = OWNED[name]
        cell = Cell(door, name, model=BASE[door])
        owned.setup(global_policy if owned.everyone else policy, cell)
        cells[door, name] = cell
    world = World(
        url=stack.gateway(policy, SWITCHYARD_GATEWAY_MAX_UPLOAD_BYTES=str(4 << 20)),
        everyone_url=everyone.gateway(global_policy),
        valkey=stack.valkey,
        cells=cells,
    )
    stack.batcher()
    # What an officer or a developer does once the keys are in use: revoke, suspend, retire.
    stopped = [cell for cell in cells.values() if cell.control in STOPPED_AFTER_START]
    for cell in stopped:
        assert _works(world.url, cell.key), cell
    for cell in stopped:
        if cell.control == "key-revoked":
            policy.revoke(cell.key)
        else:
            policy.stop_use_case(cell.key)
    policy.publish(stack.valkey)
    for cell in stopped:
        assert wait_until(functools.partial(_stopped, world.url, cell.key), timeout=10), cell
    return world


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with module_stack(guardrail_service=True) as stack, module_stack() as everyone:
        yield _start(stack, everyone)


@pytest.mark.parametrize(
    ("door", "control_name"),
    own_cells(),
    ids=[cell_id(door, name) for door, name in own_cells()],
)
def test_control_at_door(world: World, door: str, control_name: str) -> None:
    """One cell of docs/security.md's matrix, at a real gateway."""
    OWNED[control_name].check(world, world.cell(door, control_name))


# --- the governance half of "suspended" and "retired" --------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("transition", ["suspend", "retire"])
def test_governance_leaves_a_stopped_use_case_out_of_the_snapshot(transition: str) -> None:
    """GIVEN acme's approved chatbot with a key, a service account, an SLA class (a job key)
    and the playground's keys WHEN an officer suspends or retires it THEN the snapshot the
    gateway reads holds none of them: every door that goes through the gateway — the API,
    batches, file jobs, the playground, service accounts — is closed to it at once."""
    llama = make_model("llama", capabilities=["chat"])
    chatbot = make_use_case(
        make_tenant("acme"), "chatbot", models=(llama,), service_account_client_id="acme-bot"
    )
    SlaClass.objects.create(
        use_case=chatbot,
        name="day",
        turnaround_seconds=86_400,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    make_key(chatbot)
    before = snapshot_build(version=1)
    prefixes = sorted(
        e["prefix"][:4] for e in before["keys"].values() if e["use_case_id"] == chatbot.pk
    )
    assert {"job:", "play", "sk-s"} <= set(prefixes), prefixes
    assert "acme-bot" in before.get("service_accounts", {})

    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
    use_case_transition(actor=olivia, use_case=chatbot, transition=transition, reason="Audit")

    after = snapshot_build(version=2)
    assert [e for e in after["keys"].values() if e["use_case_id"] == chatbot.pk] == []
    assert after.get("service_accounts", {}) == {}
    assert str(chatbot.pk) not in after.get("use_cases", {})


# --- the table and the suite agree ---------------------------------------------------------------
def test_the_table_and_the_suite_agree() -> None:
    cells = read_table(TABLE.read_text())
    missing = [
        f"{door} × {name}" for door in DOORS for name in CONTROLS if (door, name) not in cells
    ]
    assert not missing, f"cells missing from {TABLE.name}: {missing}"
    for cell in cells.values():
        where = f"{cell.door} × {cell.control}"
        assert cell.verdict in ("enforced", "n/a"), f"{where}: {cell.text!r}"
        if cell.verdict == "enforced":
            assert cell.tests, f"{where} is enforced by no named test"
        else:
            assert len(cell.reason) > 10, f"{where} is n/a without a reason"
    for door, name in own_cells():
        node = f"{HERE}::test_control_at_door[{cell_id(door, name)}]"
        cell = cells[door, name]
        assert cell.verdict == "enforced", f"{door} × {name}: the suite runs it: {cell.text!r}"
        assert node in cell.tests, f"{door} × {name} does not name {node}"
    named = {test for cell in cells.values() for test in cell.tests}
    ids = collected({test.split("::")[0] for test in named if "[" in test})
    absent = sorted(test for test in named if test not in ids and not importable(test))
    assert not absent, f"{TABLE.name} names tests that do not exist: {absent}"


def importable(test: str) -> bool:
    """Whether ``test`` (``path::name`` or ``path::Class::name``) is a test function."""
    path, _, name = test.partition("::")
    if "[" in name:
        return False  # a parametrised id: only what pytest collects
    try:
        found: Any = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    except ImportError:
        return False
    for part in name.split("::"):
        found = getattr(found, part, None)
    return callable(found) and name.split("::")[-1].startswith("test_")


def collected(paths: set[str]) -> set[str]:
    """The node ids pytest collects from ``paths``, parametrised ids included (one run)."""
    if not paths:
        return set()
    ran = subprocess.run(
        [PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *sorted(paths)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    return {line.strip() for line in ran.stdout.splitlines() if "::" in line}


if __name__ == "__main__":  # a quick look at the table's cells
    for (door, name), cell in read_table(TABLE.read_text()).items():
        sys.stdout.write(f"{door:14} {name:26} {cell.verdict}\n")
