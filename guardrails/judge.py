"""Denied topics, judged by a guard model on the fleet in Llama Guard 3's prompt format.

The officer's topics become the guard's unsafe-content categories (S1, S2, … in the order
listed); the judged text is the last user turn (request) or the agent's answer (response),
with a few turns before it as context. The verdict (``safe`` / ``unsafe`` + codes) becomes one
finding per violated topic, entity ``topic:<name>``. The gateway makes the call
(gateway/guardrails/fleet.py); this module only writes the prompt and reads the answer.
docs/guardrails-fleet.md shows the prompt and how to serve a real Llama Guard for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from guardrails import fleet_settings
from guardrails.base import Finding, SettingsError

MAX_TOPICS = 20
MAX_DESCRIPTION_CHARS = 1000
MAX_CONTEXT_TURNS = 50
DEFAULT_CONTEXT_TURNS = 4
_TOPIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

DEFAULT_TOPICS: tuple[Mapping[str, str], ...] = (
    {
        "name": "financial_advice",
        "description": (
            "Personalised investment advice: recommending to buy, sell or hold specific "
            "stocks, bonds, funds, crypto assets or other securities, predicting their "
            "prices, or telling someone how to invest or move their savings, pension or "
            "retirement money."
        ),
    },
)

_ROLES = {"request": "User", "response": "Agent"}
_TURN_OF = {"user": "User", "assistant": "Agent"}
# A line of the judged text that would read as a new turn or a template marker to the guard.
_FORGED_TURN = re.compile(r"^(\s*)(user|agent)(\s*:)", re.IGNORECASE | re.MULTILINE)
_MARKER = re.compile(r"<(\s*)(BEGIN|END)\b", re.IGNORECASE)
_CODE = re.compile(r"^S(\d+)$")


class VerdictError(ValueError):
    """The guard model answered something that is not a Llama Guard verdict."""


class GuardModelJudge:
    """Denied topics (``banned_topics``): a guard model on the fleet judges the text."""

    name: ClassVar[str] = "banned_topics"

    def load(self) -> None:
        """Nothing to load: the model lives on the fleet."""

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        done = fleet_settings.common(settings, frozenset({"topics", "context_turns"}))
        done["topics"] = _topics(settings.get("topics", [dict(t) for t in DEFAULT_TOPICS]))
        done["context_turns"] = fleet_settings.integer(
            settings, "context_turns", DEFAULT_CONTEXT_TURNS, low=0, high=MAX_CONTEXT_TURNS
        )
        return done

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        raise NotImplementedError(
            "banned_topics runs in the gateway, which asks the guard model on the fleet "
            "(gateway.guardrails.fleet.run_fleet_check); it never runs in a guardrail worker."
        )

    def request_body(
        self,
        stage: str,
        texts: Sequence[str],
        settings: Mapping[str, Any],
        *,
        document: object = None,
    ) -> dict[str, Any]:
        """The chat completion that asks the guard model about ``texts`` (the request's texts
        for stage "request", one answer's text for "response"); ``document`` is the request
        body, which says whose turn each request text is."""
        role = _ROLES[stage]
        turns = _request_turns(texts if stage == "request" else (), document)
        if stage == "response":
            turns.append(("Agent", "\n\n".join(texts)))
        turns = turns[-(settings["context_turns"] + 1) :]
        return {
            "model": settings["model"],
            "messages": [{"role": "user", "content": prompt(role, settings["topics"], turns)}],
            "temperature": 0,
            # "unsafe", a newline and up to three tokens a code with its comma
            "max_tokens": 4 + 3 * len(settings["topics"]),
            "stream": False,
        }

    def findings(self, answer: str, settings: Mapping[str, Any]) -> list[Finding]:
        """One finding per topic the verdict names; ``VerdictError`` for anything else."""
        lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
        first = lines[0].lower() if lines else ""
        if first == "safe" and len(lines) == 1:
            return []
        if first != "unsafe" or len(lines) > 2:
            # The answer is not quoted: a misconfigured model may echo the text being judged.
            raise VerdictError(
                "The guard model's answer is not a verdict ('safe', or 'unsafe' and a line of "
                "category codes); is the model a Llama Guard?"
            )
        if len(lines) == 1:
            return [Finding("topic:unspecified")]
        topics = settings["topics"]
        found = []
        for code in lines[1].split(","):
            match = _CODE.match(code.strip())
            number = int(match.group(1)) if match else 0
            if not 1 <= number <= len(topics):
                raise VerdictError(
                    f"The guard model named a category that is not one of the {len(topics)} "
                    "topics asked about (S1…Sn)."
                )
            found.append(Finding(f"topic:{topics[number - 1]['name']}"))
        return found


def prompt(role: str, topics: Sequence[Mapping[str, str]], turns: Sequence[tuple[str, str]]) -> str:
    """Llama Guard 3's prompt, without the model's special tokens (its chat template or the
    pass-through template in docs/guardrails-fleet.md adds them)."""
    categories = "\n".join(
        f"S{i}: {topic['name']}. {topic['description']}" for i, topic in enumerate(topics, 1)
    )
    conversation = "\n\n".join(f"{who}: {_quote(text)}" for who, text in turns)
    return (
        f"Task: Check if there is unsafe content in '{role}' messages in conversations "
        "according our safety policy with the below categories.\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\n{conversation}\n\n<END CONVERSATION>\n\n"
        f"Provide your safety assessment for ONLY THE LAST {role} message in the above "
        "conversation:\n"
        " - First line must read 'safe' or 'unsafe'.\n"
        " - If unsafe, a second line must include a comma-separated list of violated categories."
    )


def _quote(text: str) -> str:
    """The text with what could forge a turn or close the conversation defused: a judged
    message must not be able to append a harmless 'last' turn of its own."""
    # Every line break the guard might honour (\r, \u2028, \v…) made a plain one first, so
    # the forged-turn pattern sees every line start.
    text = "\n".join(text.splitlines())
    text = _FORGED_TURN.sub(lambda m: f"{m.group(1)}> {m.group(2)}{m.group(3)}", text)
    return _MARKER.sub(lambda m: f"< {m.group(1)}{m.group(2)}", text).strip()


def _request_turns(texts: Sequence[str], document: object) -> list[tuple[str, str]]:
    """The conversation's user and agent turns, texts taken from ``texts`` (what earlier
    guardrails may have rewritten) when they line up with the request's messages, else from
    the request itself; a request without messages (a completion prompt) is one user turn."""
    parts = list(fleet_settings.message_parts(document))
    if not parts:
        prompt = texts or _prompt_texts(document)
        return [("User", "\n\n".join(prompt))] if prompt else []
    if len(texts) == len(parts):
        parts = [(role, text) for (role, _), text in zip(parts, texts, strict=True)]
    turns: list[tuple[str, str]] = []
    for role, text in parts:
        who = _TURN_OF.get(role)
        if who is None:  # system, developer and tool messages are not turns in Llama Guard
            continue
        if turns and turns[-1][0] == who:
            turns[-1] = (who, f"{turns[-1][1]}\n\n{text}")
        else:
            turns.append((who, text))
    return turns


def _prompt_texts(document: object) -> list[str]:
    """A completion request's prompt(s): the user turn an answer to it follows."""
    prompt = document.get("prompt") if isinstance(document, Mapping) else None
    if isinstance(prompt, str):
        return [prompt]
    return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []


def _topics(value: object) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise SettingsError("'topics' must be a list of {name, description} objects.")
    if not value:
        raise SettingsError("Name at least one topic to deny.")
    if len(value) > MAX_TOPICS:
        raise SettingsError(f"List at most {MAX_TOPICS} topics.")
    topics: list[dict[str, str]] = []
    for i, topic in enumerate(value):
        where = f"topics[{i}]"
        if not isinstance(topic, Mapping):
            raise SettingsError(f"'{where}' must be an object with a name and a description.")
        unknown = set(topic) - {"name", "description"}
        if unknown:
            raise SettingsError(f"'{where}' has unknown fields: {', '.join(sorted(unknown))}.")
        name, description = topic.get("name"), topic.get("description")
        if not isinstance(name, str) or not _TOPIC_NAME.match(name):
            raise SettingsError(
                f"'{where}.name' must be lower-case letters, digits and '_' "
                "(at most 64, starting with a letter), e.g. 'financial_advice'."
            )
        if not isinstance(description, str) or not description.strip():
            raise SettingsError(f"'{where}.description' is required: say what the topic covers.")
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise SettingsError(
                f"'{where}.description' must be at most {MAX_DESCRIPTION_CHARS} characters."
            )
        if "<" in description or ">" in description:
            raise SettingsError(f"'{where}.description' must not contain '<' and '>'.")
        if any(t["name"] == name for t in topics):
            raise SettingsError(f"Topic '{name}' is listed twice.")
        # One line per category: the guard reads a new line starting "S<n>:" as a new one.
        topics.append({"name": name, "description": " ".join(description.split())})
    return topics
