"""Serving a validated chat or text completion: engine sequences in, vLLM's responses out.

Each choice is one engine ``Sequence``. How long it runs is decided up front from its key:
the "model" wants ``natural_length`` tokens and then emits end-of-sequence (finish "stop",
an empty last token, as vLLM reports EOS), unless a stop string completes first (finish
"stop", text cut before it) or ``max_tokens`` runs out first (finish "length").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from simulator import logprobs, tokens, wire
from simulator.asgi import (
    DisconnectWatch,
    Receive,
    Send,
    end_stream,
    send_chunk,
    send_response,
    start_stream,
)
from simulator.engine import Sequence, Status, wait_until
from simulator.faults import (
    CUT_STREAM_LOG_FILTER,
    FaultPlan,
    exit_process_soon,
    strike_before_work,
)
from simulator.protocol import GenerationRequest, Prompt
from simulator.state import Simulator


@dataclass(slots=True)
class Choice:
    index: int
    prompt: Prompt
    key: int
    seq: Sequence
    stop_reason: str | None  # the stop string that ended it, if one did
    text_limit: int | None  # characters of output kept when a stop string cut it
    eos: bool  # its last token is end-of-sequence, which has no text
    sent_tokens: int = 0
    sent_chars: int = 0
    words: frozenset[str] = frozenset()  # the prompt's words, when logprobs are asked for
    logprob_chars: int = 0  # a streamed completion's text offset so far

    def token(self, index: int) -> str:
        return token_at(self.prompt, self.key, index)

    def logprob(self, index: int, top: int) -> logprobs.TokenLogprob:
        """Token ``index`` with its logprob (simulator/logprobs.py); end-of-sequence has no
        text."""
        end = self.eos and index == self.seq.target_tokens - 1
        token = "" if end else self.token(index)
        return logprobs.token_logprob(token, self.key, index, self.words, top)

    def delta(self, start: int, stop: int) -> str:
        """The text of tokens [start, stop), as the client sees it."""
        visible = self.seq.target_tokens - 1 if self.eos else self.seq.target_tokens
        text = "".join(self.token(i) for i in range(start, min(stop, visible)))
        if self.text_limit is not None:
            text = text[: max(0, self.text_limit - self.sent_chars)]
        self.sent_chars += len(text)
        return text


def token_at(prompt: Prompt, key: int, index: int) -> str:
    """Token ``index`` of the answer: the prompt's fixed answer (a guard model's verdict)
    first, then words drawn from the key."""
    if index < len(prompt.answer):
        return prompt.answer[index]
    return tokens.token_text(key, index)


def plan_choice(
    index: int, prompt: Prompt, key: int, max_tokens: int, req: GenerationRequest
) -> Choice:
    # A fixed answer ends where it ends (then end-of-sequence); free text at its natural length.
    wanted = len(prompt.answer) + 1 if prompt.answer else tokens.natural_length(key)
    natural = None if req.ignore_eos else max(wanted, req.min_tokens + 1)
    target, reason, eos = max_tokens, "length", False
    if natural is not None and natural <= max_tokens:
        target, reason, eos = natural, "stop", True
    stop_reason: str | None = None
    text_limit: int | None = None
    if req.stop:
        visible = target - 1 if eos else target
        found = tokens.find_stop(lambda i: token_at(prompt, key, i), visible, req.stop)
        if found is not None and found[0] >= req.min_tokens:
            target, stop_reason, text_limit = found
            reason, eos = "stop", False
            if req.include_stop_str_in_output:
                text_limit += len(stop_reason)
    seq = Sequence(
        prompt_tokens=prompt.num_tokens,
        target_tokens=target,
        target_reason=reason,
        priority=req.priority,
        block_hashes=prompt.blocks,
        stream=req.stream,
    )
    return Choice(index, prompt, key, seq, stop_reason, text_limit, eos)


def plan_choices(req: GenerationRequest) -> list[Choice]:
    choices = []
    for p, prompt in enumerate(req.prompts):
        for j in range(req.n):
            # Choice 0 answers like n=1 would; the others sample differently.
            key = prompt.key if j == 0 else tokens.splitmix64(prompt.key + j)
            choices.append(plan_choice(p * req.n + j, prompt, key, req.max_tokens[p], req))
    if req.logprobs is not None:
        words = {id(p): logprobs.prompt_words(p.text) for p in req.prompts}
        for c in choices:
            c.words = words[id(c.prompt)]
            c.logprob_chars = len(c.prompt.text) if req.echo and not req.chat else 0
    return choices


async def serve_generation(
    sim: Simulator,
    req: GenerationRequest,
    plan: FaultPlan,
    request_id: str,
    receive: Receive,
    send: Send,
) -> None:
    watch = DisconnectWatch(receive)
    choices = plan_choices(req)
    try:
        if await strike_before_work(plan, watch, send):
            return

        engine = sim.engine

        def abort_all() -> None:
            for c in choices:
                engine.abort(c.seq)

        watch.on_disconnect(abort_all)
        for c in choices:
            engine.submit(c.seq)
        prefix = ("chatcmpl-" if req.chat else "cmpl-") + request_id
        if req.stream:
            completed = await _stream(sim, req, choices, prefix, plan, send)
            if not completed:
                abort_all()
                return
        else:
            for c in choices:
                await c.seq.wait_finished()
                if c.seq.finish_reason == "abort":
                    return
            watch.cancel()
            body = _full_response(req, choices, prefix, sim.fingerprint)
            await send_response(send, 200, orjson.dumps(body))
    finally:
        watch.cancel()
        if plan.exit_after_response:
            exit_process_soon()


def _prompt_tokens(req: GenerationRequest) -> int:
    return sum(p.num_tokens for p in req.prompts)


def _full_response(
    req: GenerationRequest, choices: list[Choice], request_id: str, fingerprint: str
) -> wire.Json:
    created = int(time.time())
    model = req.model
    completion_tokens = 0
    out = []
    for c in choices:
        seq = c.seq
        completion_tokens += seq.generated
        text = c.delta(0, seq.generated)
        reason = seq.finish_reason or "stop"
        lp = _logprobs(req, c, 0, seq.generated)
        if req.chat:
            out.append(wire.chat_choice(c.index, req.echo_text + text, reason, c.stop_reason, lp))
        else:
            text = c.prompt.text + text if req.echo else text
            out.append(wire.completion_choice(c.index, text, reason, c.stop_reason, lp))
    build = wire.chat_response if req.chat else wire.completion_response
    return build(
        request_id, created, model, out, _prompt_tokens(req), completion_tokens, fingerprint
    )


async def _stream(
    sim: Simulator,
    req: GenerationRequest,
    choices: list[Choice],
    request_id: str,
    plan: FaultPlan,
    send: Send,
) -> bool:
    """Stream the answer as vLLM does; False if it ended early (client gone or cut).

    One chunk per token, as vLLM's engine emits them. The fingerprint rides on each
    finish chunk, unless a usage chunk follows: then it rides on that one instead.
    """
    created = int(time.time())
    model = req.model
    chunk = wire.chat_chunk if req.chat else wire.completion_chunk
    finish_fingerprint = None if req.include_usage else sim.fingerprint
    await start_stream(send)
    pending = list(choices)
    first = True
    tokens_sent = 0
    while pending:
        await wait_until(
            [c.seq for c in pending],
            lambda: any(c.seq.generated > c.sent_tokens or c.seq.finished for c in pending),
        )
        frames: list[bytes] = []
        if first and req.chat:
            for c in choices:
                running = _running(req, c, 0)
                frames.append(
                    wire.sse(wire.chat_role_chunk(request_id, created, model, c.index, running))
                )
        first = False
        for c in list(pending):
            seq = c.seq
            if seq.finish_reason == "abort":
                return False
            done = seq.status is Status.FINISHED
            end = seq.generated
            for i in range(c.sent_tokens, end):
                last = done and i == end - 1
                text = c.delta(i, i + 1)
                if i == 0 and req.echo:
                    text = (req.echo_text if req.chat else c.prompt.text) + text
                payload = chunk(
                    request_id,
                    created,
                    model,
                    c.index,
                    text,
                    seq.finish_reason if last else None,
                    c.stop_reason if last else None,
                    _running(req, c, i + 1),
                    finish_fingerprint if last else None,
                    _logprobs(req, c, i, i + 1),
                )
                frames.append(wire.sse(payload))
            tokens_sent += end - c.sent_tokens
            c.sent_tokens = end
            if done:
                pending.remove(c)
        if frames:
            await send_chunk(send, b"".join(frames))
        if plan.cut_stream_after_tokens is not None and tokens_sent >= plan.cut_stream_after_tokens:
            # Returning without the final body makes uvicorn drop the connection.
            CUT_STREAM_LOG_FILTER.expected += 1
            return False
    tail = []
    if req.include_usage:
        completion_tokens = sum(c.seq.generated for c in choices)
        usage = wire.usage_chunk(
            request_id,
            created,
            model,
            _prompt_tokens(req),
            completion_tokens,
            sim.fingerprint,
            chat=req.chat,
        )
        tail.append(wire.sse(usage))
    tail.append(wire.DONE)
    await send_chunk(send, b"".join(tail))
    await end_stream(send)
    return True


def _logprobs(req: GenerationRequest, choice: Choice, start: int, stop: int) -> wire.Json | None:
    """``choice.logprobs`` for tokens [start, stop), when the request asked for them."""
    top = req.logprobs
    if top is None:
        return None
    entries = [choice.logprob(i, top) for i in range(start, stop)]
    if req.chat:
        return logprobs.chat_content(entries, top)
    shaped = logprobs.completion_logprobs(entries, top, choice.logprob_chars)
    choice.logprob_chars += sum(len(e.token) for e in entries)
    return shaped


def _running(req: GenerationRequest, choice: Choice, completion_tokens: int) -> wire.Json | None:
    if not req.continuous_usage:
        return None
    return wire.running_usage(choice.prompt.num_tokens, completion_tokens, chat=req.chat)
