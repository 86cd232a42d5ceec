"""Where the texts are in a request and in an answer: the one reading of the OpenAI shapes
that every guardrail stage shares — the gateway's request and response stages
(gateway/guardrails/run.py), its streamed answers (gateway/guardrails/stream.py, delta by delta)
and the fleet checks' view of the conversation (guardrails/fleet_settings.py) — so that
what is checked is what the model reads, and the texts line up with the roles.

A request's texts: each chat message's ``content`` (a string, or a list of bare strings and
text, ``input_text``, ``output_text`` and ``refusal`` parts), an assistant's ``refusal``,
its ``tool_calls[].function.arguments`` (and the legacy ``function_call``'s), the chat's
retrieved ``documents`` (vLLM's RAG field; said by ``document``); a
completion's ``prompt`` (a string or a list of them) and ``suffix``; an embedding's
``input`` (the same) or ``messages``. Media parts (images, audio, video) are not text: no
text guardrail reads them.

``strict`` (the request stage, run only when a use case has request guardrails): what the
model would read but this cannot read as text — token ids, prompt embeddings, unknown part
types, a text that is not a string — raises ``Unreadable`` naming where it is, and the
gateway refuses the request (a check cannot pass what it cannot read). Otherwise such
things are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (container, key, role): container[key] is one text, said by role ("user" for a prompt).
Slot = tuple[Any, Any, str]

# Content part types whose text the model reads, and the member that holds it.
TEXT_PARTS: Mapping[str, str] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
}
# Content part types that carry media, not text (vLLM's multimodal parts, OpenAI's).
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image_embeds", "audio_url", "input_audio", "video_url"}
)
# An assistant message's (or an answer's, or a stream delta's) other texts besides content.
_MESSAGE_TEXTS = ("refusal", "reasoning_content", "reasoning")
#: who said a retrieved document's text (vLLM's chat ``documents``): neither a message's role
#: nor the user — a guardrail may be scoped to it like the ``tool`` role
DOCUMENT = "document"
_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_TRANSCRIPTIONS = "/v1/audio/transcriptions"


class Unreadable(ValueError):
    """A part of a request that the model reads but the guardrails cannot read as text."""

    def __init__(self, param: str, what: str) -> None:
        super().__init__(f"{param}: {what}")
        self.param = param
        self.what = what


def request_slots(path: str, document: Mapping[str, Any], *, strict: bool = True) -> list[Slot]:
    """The texts of a request to ``path`` that the model reads, in the order they come."""
    slots: list[Slot] = []
    if path == _TRANSCRIPTIONS:
        # A multipart form's text fields: the model reads the prompt (Whisper's initial
        # prompt); the audio is checked through its transcript, at the response stage.
        if isinstance(document.get("prompt"), str):
            slots.append((document, "prompt", "user"))
        return slots
    if path == _COMPLETIONS:
        _prompt_slots(document, "prompt", slots, strict)
        if isinstance(document.get("suffix"), str):
            slots.append((document, "suffix", "user"))
        if strict and document.get("prompt_embeds") is not None:
            raise Unreadable("prompt_embeds", "prompt embeddings")
        return slots
    if path == _CHAT or "messages" in document:  # an embedding may be asked of messages too
        messages = document.get("messages")
        if isinstance(messages, list):
            for i, message in enumerate(messages):
                if isinstance(message, dict):
                    message_slots(message, slots, f"messages[{i}]", strict=strict)
                elif strict:
                    raise Unreadable(f"messages[{i}]", "a message that is not an object")
        elif strict and messages is not None:
            raise Unreadable("messages", "messages that are not a list")
        _tool_slots(document, slots)
        if path == _CHAT:
            _document_slots(document, slots, strict)
    if path != _CHAT:
        _prompt_slots(document, "input", slots, strict)
    return slots


def message_slots(
    message: dict[str, Any], slots: list[Slot], where: str = "", *, strict: bool = False
) -> None:
    """Append the texts of one chat message — or of an answer's message, or of a stream's
    delta, which have its shape — to ``slots``."""
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    content = message.get("content")
    if isinstance(content, str):
        slots.append((message, "content", role))
    elif isinstance(content, list):
        for j, part in enumerate(content):
            _part_slot(content, j, part, role, slots, f"{where}.content[{j}]", strict)
    elif strict and content is not None:
        raise Unreadable(f"{where}.content", "content that is neither a string nor a list")
    for key in _MESSAGE_TEXTS:
        value = message.get(key)
        if isinstance(value, str):
            slots.append((message, key, role))
        elif strict and value is not None:
            raise Unreadable(f"{where}.{key}", "a value that is not a string")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for j, call in enumerate(calls):
            if isinstance(call, dict):
                function = call.get("function")
                _arguments_slot(function, role, slots, f"{where}.tool_calls[{j}].function", strict)
            elif strict:
                raise Unreadable(f"{where}.tool_calls[{j}]", "a tool call that is not an object")
    elif strict and calls is not None:
        raise Unreadable(f"{where}.tool_calls", "tool calls that are not a list")
    if "function_call" in message:
        _arguments_slot(message["function_call"], role, slots, f"{where}.function_call", strict)


def answer_slots(path: str, answer: Any) -> list[Slot]:
    """The texts of a whole (non-streamed) answer: each choice's message — content,
    refusal, reasoning, tool-call arguments — or a completion choice's text; a
    transcription's text with its segments' and words' (``verbose_json``)."""
    if path == _TRANSCRIPTIONS:
        return _transcript_slots(answer)
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return []
    slots: list[Slot] = []
    for choice in answer["choices"]:
        if not isinstance(choice, dict):
            continue
        if path == _CHAT:
            message = choice.get("message")
            if isinstance(message, dict):
                message_slots(message, slots)
        elif isinstance(choice.get("text"), str):
            slots.append((choice, "text", "assistant"))
    return slots


def _part_slot(
    content: list[Any], j: int, part: Any, role: str, slots: list[Slot], where: str, strict: bool
) -> None:
    if isinstance(part, str):  # vLLM reads a bare string in a content list as text
        slots.append((content, j, role))
        return
    kind = part.get("type") if isinstance(part, dict) else None
    member = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if member is not None:
        assert isinstance(part, dict)
        if isinstance(part.get(member), str):
            slots.append((part, member, role))
        elif strict:
            raise Unreadable(f"{where}.{member}", f"a '{kind}' part whose {member} is not a string")
    elif strict and kind not in MEDIA_PARTS:
        shown = f"a part of type '{kind}'" if isinstance(kind, str) else "a part without a type"
        raise Unreadable(where, shown if isinstance(part, dict) else "a part that is not text")


def _arguments_slot(function: Any, role: str, slots: list[Slot], where: str, strict: bool) -> None:
    if not isinstance(function, dict):
        if strict and function is not None:
            raise Unreadable(where, "a function call that is not an object")
        return
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        slots.append((function, "arguments", role))
    elif strict and arguments is not None:
        raise Unreadable(f"{where}.arguments", "arguments that are not a JSON string")


def _prompt_slots(document: Mapping[str, Any], key: str, slots: list[Slot], strict: bool) -> None:
    """A prompt or an input: a string, or a list of strings. Token ids (a list of integers,
    or of lists of them) are not text."""
    value = document.get(key)
    if isinstance(value, str):
        slots.append((document, key, "user"))
    elif isinstance(value, list):
        if strict and value and isinstance(value[0], int):
            raise Unreadable(key, "token ids")
        for i, item in enumerate(value):
            if isinstance(item, str):
                slots.append((value, i, "user"))
            elif strict:
                what = "token ids" if isinstance(item, list | int) else "a value that is not text"
                raise Unreadable(f"{key}[{i}]", what)
    elif strict and value is not None:
        raise Unreadable(key, "a value that is neither a string nor a list of strings")


def _transcript_slots(answer: Any) -> list[Slot]:
    if not isinstance(answer, dict):
        return []
    slots: list[Slot] = []
    if isinstance(answer.get("text"), str):
        slots.append((answer, "text", "assistant"))
    for key, field in (("segments", "text"), ("words", "word")):
        items = answer.get(key)
        if isinstance(items, list):
            slots += [
                (item, field, "assistant")
                for item in items
                if isinstance(item, dict) and isinstance(item.get(field), str)
            ]
    return slots


def _document_slots(document: Mapping[str, Any], slots: list[Slot], strict: bool) -> None:
    """vLLM's ``documents`` (retrieved passages a RAG chat template lays before the model):
    each a string or an object of strings (``title``, ``text``…), all read by the model, said
    by ``document`` — untrusted text, like a tool's answer."""
    value = document.get("documents")
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, str):
                slots.append((value, i, DOCUMENT))
            elif isinstance(item, dict):
                for key, text in item.items():
                    if isinstance(text, str):
                        slots.append((item, key, DOCUMENT))
                    elif strict and text is not None:
                        raise Unreadable(f"documents[{i}].{key}", "a value that is not text")
            elif strict:
                raise Unreadable(f"documents[{i}]", "a document that is neither text nor an object")
    elif strict and value is not None:
        raise Unreadable("documents", "documents that are not a list")


def _tool_slots(document: Mapping[str, Any], slots: list[Slot]) -> None:
    """The tools' descriptions — the function's and every one in its parameters' schema — are
    read by the model like a system prompt. Names stay as they are: a tool call must name a
    tool the client has, and a name is an identifier, not prose."""
    functions: list[Any] = []
    tools = document.get("tools")
    if isinstance(tools, list):
        functions += [tool.get("function") for tool in tools if isinstance(tool, dict)]
    legacy = document.get("functions")
    if isinstance(legacy, list):
        functions += legacy
    for function in functions:
        if isinstance(function, dict):
            _description_slots(function, slots)


def _description_slots(schema: Any, slots: list[Slot], depth: int = 0) -> None:
    if depth > 32:  # a schema is a tree a client wrote: bounded, whatever its depth
        return
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "description" and isinstance(value, str):
                slots.append((schema, key, "system"))
            else:
                _description_slots(value, slots, depth + 1)
    elif isinstance(schema, list):
        for item in schema:
            _description_slots(item, slots, depth + 1)
