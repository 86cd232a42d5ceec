"""Chat and text completion requests: parsed, validated and tokenized, in vLLM's order.

vLLM checks a request in layers, and clients see whichever layer fails first: a few
"before" validators on the raw body (``stream_options`` without ``stream``, an empty
completion prompt), then the body's types (FastAPI/pydantic, "Bad Request"), then the model
name (404), then the conversation, lengths and sampling parameters ("BadRequestError" with
a ``param``). ``parse_generation`` keeps that order and vLLM 0.32's wording.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from simulator import guard, tokens
from simulator.config import SimulatorConfig
from simulator.errors import model_not_found, vllm_validation
from simulator.validation import (
    Body,
    Invalid,
    to_bool,
    to_dict,
    to_float,
    to_int,
    to_list,
    to_str,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The X-Vllm-Priority header overrides the body's priority, as in vLLM.
PRIORITY_HEADER = b"x-vllm-priority"
# The legacy completions API stops at 16 tokens unless told otherwise; chat does not.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# vLLM's default --max-logprobs: the most alternatives a token's logprobs may list.
MAX_LOGPROBS = 20

# The members of vLLM's chat-message union that pydantic reports, in order, when a message
# has no role (vLLM shows ten and counts eleven).
_ROLELESS_MESSAGE_ERRORS = (
    "ChatCompletionDeveloperMessageParam.role",
    "ChatCompletionSystemMessageParam.role",
    "ChatCompletionUserMessageParam.role",
    "ChatCompletionAssistantMessageParam.role",
    "ChatCompletionToolMessageParam.role",
    "ChatCompletionToolMessageParam.tool_call_id",
    "ChatCompletionFunctionMessageParam.name",
    "ChatCompletionFunctionMessageParam.role",
    "CustomChatCompletionMessageParam.role",
    "Message.author",
    "Message.content",
)


@dataclass(slots=True)
class Prompt:
    text: str  # rendered chat prompt or completion prompt; "" for token-id prompts
    num_tokens: int
    source: str | tuple[int, ...]  # what the answer depends on
    blocks: list[int] = field(default_factory=list)
    from_text: bool = True  # vLLM words the too-long error differently for token ids
    key: int = 0  # seeds the generated answer; set once the request's seed is known
    answer: tuple[str, ...] = ()  # tokens the model must say first (a guard model's verdict)


@dataclass(slots=True)
class GenerationRequest:
    chat: bool
    model: str
    prompts: list[Prompt]
    max_tokens: list[int]  # per prompt, after vLLM's clamping to the context left
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0
    echo: bool = False
    echo_text: str = ""  # chat: the last message's content, when echo applies
    #: how many alternatives each token's logprobs list; None: no logprobs asked for
    logprobs: int | None = None


def _stop_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = to_list(value)
    if not all(isinstance(s, str) for s in items):
        raise Invalid("string_type", "Input should be a valid string")
    return list(items)


def _content_text(content: object) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    raise Invalid("string_type", "Input should be a valid string")


def _chat_messages(body: Body) -> list[tuple[str, str]]:
    raw = body.required("messages", to_list)
    if raw is None:
        return []
    messages: list[tuple[str, str]] = []
    for i, item in enumerate(raw):
        try:
            msg = to_dict(item)
        except Invalid as exc:
            body.fail(exc.kind, f"messages.{i}", exc.msg, item)
            continue
        role = msg.get("role")
        if "role" not in msg:
            for where in _ROLELESS_MESSAGE_ERRORS:
                body.fail("missing", f"messages.{i}.{where}", "Field required", msg)
            continue
        if not isinstance(role, str):
            body.fail("string_type", f"messages.{i}.role", "Input should be a valid string", role)
            continue
        try:
            messages.append((role, _content_text(msg.get("content"))))
        except Invalid as exc:
            body.fail(exc.kind, f"messages.{i}.content", exc.msg, msg.get("content"))
    return messages


def _completion_prompts(body: Body, config: SimulatorConfig) -> list[Prompt]:
    raw = body.data.get("prompt")
    items: list[str | list[int]]
    if isinstance(raw, str):
        items = [raw]
    elif isinstance(raw, list) and raw and all(type(t) is int and t >= 0 for t in raw):
        items = [list(raw)]
    elif isinstance(raw, list) and all(
        isinstance(p, str) or (isinstance(p, list) and all(type(t) is int for t in p)) for p in raw
    ):
        items = list(raw)
    else:
        body.fail("string_type", "prompt", "Input should be a valid string", raw)
        return []
    block = config.block_size
    prompts = []
    for item in items:
        if isinstance(item, str):
            prompts.append(
                Prompt(
                    text=item,
                    num_tokens=tokens.count_text_tokens(item),
                    source=item,
                    blocks=tokens.text_blocks(item, block),
                )
            )
        else:
            prompts.append(
                Prompt(
                    text="",
                    num_tokens=len(item),
                    source=tuple(item),
                    blocks=tokens.token_id_blocks(item, block),
                    from_text=False,
                )
            )
    return prompts


def _check_seed(body: Body, seed: int | None) -> None:
    if seed is not None and seed > INT64_MAX:
        body.fail(
            "less_than_equal",
            "seed",
            f"Input should be less than or equal to {INT64_MAX}",
            seed,
            {"le": INT64_MAX},
        )
    elif seed is not None and seed < INT64_MIN:
        body.fail(
            "greater_than_equal",
            "seed",
            f"Input should be greater than or equal to {INT64_MIN}",
            seed,
            {"ge": INT64_MIN},
        )


def parse_generation(
    data: object,
    *,
    chat: bool,
    config: SimulatorConfig,
    priority_header: bytes | None = None,
) -> GenerationRequest:
    body = Body(data)
    raw = body.data
    # vLLM's "before" validators run ahead of every type check.
    if raw.get("stream_options") and not raw.get("stream"):
        raise vllm_validation(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    if not chat and (raw.get("prompt") is None or raw.get("prompt") == ""):
        raise vllm_validation(
            "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
        )

    # Field by field, in the order vLLM's request models declare them.
    messages = _chat_messages(body) if chat else []
    model = body.get("model", to_str, "")
    asked_logprobs: int | bool | None = body.get("logprobs", to_bool, False) if chat else None
    top_logprobs: int | None = body.get("top_logprobs", to_int, 0) if chat else None
    prompts = [] if chat else _completion_prompts(body, config)
    echo = body.get("echo", to_bool, False) if not chat else False
    if not chat:
        asked_logprobs = body.get("logprobs", to_int, None)
    max_tokens_field = "max_tokens"
    max_tokens: int | None = body.get(
        "max_tokens", to_int, None if chat else COMPLETION_DEFAULT_MAX_TOKENS
    )
    if chat and body.has("max_completion_tokens"):
        max_tokens_field = "max_completion_tokens"
        max_tokens = body.get("max_completion_tokens", to_int, None)
    n = body.get("n", to_int, 1)
    seed = body.get("seed", to_int, None)
    _check_seed(body, seed)
    stop: list[str] = body.get("stop", _stop_list, [])
    stream = body.get("stream", to_bool, False)
    stream_options: dict[str, Any] = body.get("stream_options", to_dict, {})
    temperature = body.get("temperature", to_float, None)
    top_p = body.get("top_p", to_float, None)
    include_stop = body.get("include_stop_str_in_output", to_bool, False)
    ignore_eos = body.get("ignore_eos", to_bool, False)
    min_tokens = body.get("min_tokens", to_int, 0)
    if chat:
        echo = body.get("echo", to_bool, False)
    priority = body.get("priority", to_int, 0)
    body.check()
    logprobs = _logprobs(chat, asked_logprobs, top_logprobs)

    if model and model not in config.served_model_names:
        raise model_not_found(model, config.served_model_names)
    if chat:
        if not messages:
            raise vllm_validation(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        rendered = tokens.render_chat(messages)
        prompts = [
            Prompt(
                text=rendered,
                num_tokens=tokens.count_chat_tokens([c for _, c in messages]),
                source=rendered,
                blocks=tokens.text_blocks(rendered, config.block_size),
            )
        ]
    elif not prompts:
        raise vllm_validation("You must pass at least one prompt")
    for p in prompts:
        p.key = tokens.stable_key(chat, p.source, seed, config.seed)
    if config.kind == "guard":
        # The Llama Guard prompt is the last user message (chat) or the prompt (completions).
        judged = [c for role, c in messages if role == "user"][-1:] if chat else None
        for p in prompts:
            p.answer = guard.answer_tokens(judged[0] if judged else p.text)

    if priority_header is not None:
        # vLLM ignores an unparsable header and keeps the body's value.
        with contextlib.suppress(ValueError):
            priority = int(priority_header)

    limits = [_max_tokens_for(p, max_tokens, max_tokens_field, config) for p in prompts]
    _check_sampling(n, min(limits), temperature, top_p, min_tokens, stop)
    include_usage = bool(stream_options.get("include_usage", True)) if stream_options else False
    last_role, last_content = messages[-1] if messages else ("", "")
    return GenerationRequest(
        chat=chat,
        model=model or config.model_name,
        prompts=prompts,
        max_tokens=limits,
        n=n,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(stream_options.get("continuous_usage_stats")),
        stop=stop,
        include_stop_str_in_output=include_stop,
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
        priority=priority,
        echo=echo,
        echo_text=last_content if chat and echo and last_role == "assistant" else "",
        logprobs=logprobs,
    )


def _logprobs(chat: bool, asked: int | bool | None, top: int | None) -> int | None:
    """How many alternatives per token (None: no logprobs), refused as vLLM refuses: a
    negative count other than -1, top_logprobs without logprobs, more than 20 (vLLM's
    default ``--max-logprobs``; -1 asks for the whole vocabulary, which is more)."""
    name = "top_logprobs" if chat else "logprobs"
    count = top if chat else asked
    if count is not None and count < 0 and count != -1:
        raise vllm_validation(f"`{name}` must be a positive value or -1.", name, count)
    if chat and count and not asked:
        raise vllm_validation(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    if (chat and not asked) or count is None:
        return None
    wanted = len(tokens.VOCABULARY) if count == -1 else count
    if wanted > MAX_LOGPROBS:
        raise vllm_validation(
            f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            "logprobs",
            wanted,
        )
    return wanted


def _check_sampling(
    n: int,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    min_tokens: int,
    stop: list[str],
) -> None:
    """vLLM's SamplingParams checks, in its order and with its wording."""
    if n < 1:
        raise vllm_validation(f"n must be at least 1, got {n}.")
    if temperature is not None:
        if temperature < 0:
            raise vllm_validation(
                f"temperature must be non-negative, got {temperature}.", "temperature", temperature
            )
        if temperature > 2:
            raise vllm_validation(
                f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature
            )
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise vllm_validation(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    if max_tokens < 1:
        raise vllm_validation(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    if min_tokens < 0:
        raise vllm_validation(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise vllm_validation(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    if any(s == "" for s in stop):
        raise vllm_validation("stop cannot contain an empty string.")
    if temperature is not None and temperature < 1e-5 and n > 1:
        raise vllm_validation(f"n must be 1 when using greedy sampling, got {n}.")


def _max_tokens_for(
    prompt: Prompt, requested: int | None, field_name: str, config: SimulatorConfig
) -> int:
    """vLLM's length rules: reject what cannot fit at all, clamp the rest to the context."""
    limit = config.max_model_len
    if requested is not None and requested > limit:
        raise vllm_validation(
            f"{field_name}={requested} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            field_name,
            requested,
        )
    check_prompt_length(prompt.num_tokens, limit, truncated=prompt.from_text)
    if prompt.num_tokens == 0:
        raise vllm_validation("The decoder prompt cannot be empty")
    if prompt.num_tokens == limit:
        raise vllm_validation(
            f"The decoder prompt (length {limit}) plus the number of requested output tokens "
            f"(at least 1) is longer than the maximum model length of {limit}. Make sure that "
            "`max_model_len` is no smaller than the number of text tokens (prompt + requested "
            "output tokens)."
        )
    room = limit - prompt.num_tokens
    return room if requested is None else min(requested, room)


def check_prompt_length(num_tokens: int, limit: int, *, truncated: bool) -> None:
    """Refuse a prompt longer than the context.

    vLLM tokenizes text with truncation at limit + 1, so for text it can only say "at least
    limit + 1"; token-id prompts are counted exactly.
    """
    if num_tokens <= limit:
        return
    shown = limit + 1 if truncated else num_tokens
    qualifier = "at least " if truncated else ""
    raise vllm_validation(
        f"This model's maximum context length is {limit} tokens. However, your prompt "
        f"contains {qualifier}{shown} input tokens, which exceeds this limit even without "
        "any output tokens. Please reduce the length of the input prompt.",
        "input_tokens",
        shown,
    )
