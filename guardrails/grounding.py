"""Groundedness for RAG use cases: each sentence of the answer must be close, in an embedding
model's space, to some chunk of the context the request supplied.

The context is the request's messages of chosen roles (by default system and tool: where RAG
applications put retrieved passages) and the documents in an optional request field (vLLM's
``documents``: strings or ``{"title", "text"}`` objects). Each answer sentence is a claim; a
claim whose best cosine similarity to any context chunk is below the threshold is one
``ungrounded`` finding, scored 1 − similarity. The gateway asks the embedding model
(gateway/guardrails/fleet.py); this module says what to embed and what the vectors mean.
Similarity is evidence of support, not proof of it: docs/guardrails-fleet.md lists the limits.

``method`` chooses the evidence: "embedding" (the default, above), "logprobs" (spans the model
generated with low confidence, read from the answer's own token logprobs:
guardrails/confidence.py; no embedding model, so ``model`` may be left out) or "both".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from guardrails import fleet_settings
from guardrails.base import Finding, SettingsError

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_THRESHOLD = 0.5
METHODS = ("embedding", "logprobs", "both")
#: a token below e^-2.3 ≈ 0.1 probability is unsure
DEFAULT_MIN_LOGPROB = -2.3
DEFAULT_MIN_SPAN_TOKENS = 3
_KNOWN = frozenset(
    {
        "method",
        "min_logprob",
        "min_span_tokens",
        "threshold",
        "context_roles",
        "documents_field",
        "min_claim_chars",
        "max_claims",
        "chunk_chars",
        "require_context",
    }
)
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# A sentence ends at . ! or ? followed by space; a line break always ends one.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
_BULLET = re.compile(r"^(?:[-*•]|\d+[.)])\s+")


class GroundednessCheck:
    """Groundedness (``groundedness``): the answer's sentences against the request's context."""

    name: ClassVar[str] = "groundedness"

    def load(self) -> None:
        """Nothing to load: the embedding model lives on the fleet."""

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(settings, Mapping):
            raise SettingsError("Settings must be an object.")
        method = settings.get("method", "embedding")
        if method not in METHODS:
            raise SettingsError(f"'method' must be one of {', '.join(METHODS)}.")
        if method == "logprobs" and not settings.get("model"):
            # Nothing is asked of an embedding model: the answer brings its own evidence.
            done = fleet_settings.common({**settings, "model": "-"}, _KNOWN)
            done["model"] = None
        else:
            done = fleet_settings.common(settings, _KNOWN)
        min_logprob = fleet_settings.number(
            settings, "min_logprob", DEFAULT_MIN_LOGPROB, low=-100.0, high=0.0
        )
        if min_logprob >= 0:
            raise SettingsError("'min_logprob' must be below 0 (a log probability).")
        threshold = fleet_settings.number(
            settings, "threshold", DEFAULT_THRESHOLD, low=0.0, high=1.0
        )
        if threshold <= 0:
            raise SettingsError("'threshold' must be more than 0 and at most 1.")
        roles = settings.get("context_roles", ["system", "tool"])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise SettingsError("'context_roles' must be a list of message roles.")
        for role in roles:
            if role not in ROLES:
                raise SettingsError(
                    f"'{role}' is not a message role; choose from {', '.join(ROLES)}."
                )
        field = settings.get("documents_field", "documents")
        if field is not None and (
            not isinstance(field, str) or not _FIELD.match(field) or field == "messages"
        ):
            raise SettingsError(
                "'documents_field' must name a request field holding the documents (not "
                "'messages'), or be null."
            )
        if not roles and field is None:
            raise SettingsError(
                "With no context roles and no documents field there is no context to check "
                "answers against."
            )
        require = settings.get("require_context", False)
        if not isinstance(require, bool):
            raise SettingsError("'require_context' must be true or false.")
        done.update(
            method=method,
            min_logprob=min_logprob,
            min_span_tokens=fleet_settings.integer(
                settings, "min_span_tokens", DEFAULT_MIN_SPAN_TOKENS, low=1, high=256
            ),
            threshold=threshold,
            context_roles=list(dict.fromkeys(roles)),
            documents_field=field,
            min_claim_chars=fleet_settings.integer(
                settings, "min_claim_chars", 20, low=0, high=1000
            ),
            max_claims=fleet_settings.integer(settings, "max_claims", 64, low=1, high=512),
            chunk_chars=fleet_settings.integer(settings, "chunk_chars", 300, low=20, high=20_000),
            require_context=require,
        )
        return done

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        raise NotImplementedError(
            "groundedness runs in the gateway, which asks an embedding model on the fleet "
            "(gateway.guardrails.fleet.run_fleet_check); it never runs in a guardrail worker."
        )

    def context(self, document: object, settings: Mapping[str, Any]) -> list[str]:
        """The request's context as chunks of whole sentences, at most ``chunk_chars`` each
        (a sentence longer than that is a chunk of its own)."""
        if not isinstance(document, Mapping):
            return []
        roles = set(settings["context_roles"])
        texts = [text for role, text in fleet_settings.message_parts(document) if role in roles]
        field = settings["documents_field"]
        supplied = document.get(field) if field else None
        for item in supplied if isinstance(supplied, list) else ():
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping) and isinstance(item.get("text"), str):
                texts.append(item["text"])
        chunks: list[str] = []
        for text in texts:
            chunks += _chunks(sentences(text), settings["chunk_chars"])
        return chunks

    def claims(self, answer: str, min_chars: int = 0) -> list[str]:
        """The answer's sentences: each one a claim; shorter than ``min_chars`` ones ("Sure.")
        say too little to check."""
        return [s for s in sentences(answer) if len(s) >= min_chars]

    def findings(
        self,
        claim_vectors: Sequence[Sequence[float]],
        context_vectors: Sequence[Sequence[float]],
        settings: Mapping[str, Any],
    ) -> list[Finding]:
        """One ``ungrounded`` finding per claim whose best cosine similarity to any context
        chunk is below the threshold (no context: every claim), scored 1 − similarity."""
        if not claim_vectors:
            return []
        if not context_vectors:
            return [Finding("ungrounded", score=1.0) for _ in claim_vectors]
        import numpy as np  # imported here: governance imports this module to validate

        claims = _normalised(np.asarray(claim_vectors, dtype=np.float64))
        context = _normalised(np.asarray(context_vectors, dtype=np.float64))
        best = (claims @ context.T).max(axis=1).clip(0.0, 1.0)
        threshold = settings["threshold"]
        return [
            Finding("ungrounded", score=round(1.0 - float(s), 4)) for s in best if s < threshold
        ]


def needs_logprobs(settings: Mapping[str, Any]) -> bool:
    """Whether a selection's settings (validated or not) read the answer's token logprobs:
    what makes the gateway ask the model for them (gateway/guardrail_plan.py)."""
    return settings.get("method") in ("logprobs", "both")


def sentences(text: str) -> list[str]:
    """Sentences and lines, list bullets dropped, blanks left out."""
    parts = (_BULLET.sub("", part.strip()) for part in _SENTENCE_END.split(text))
    return [part for part in parts if part]


def _chunks(parts: list[str], limit: int) -> list[str]:
    chunks: list[str] = []
    for part in parts:
        if chunks and len(chunks[-1]) + 1 + len(part) <= limit:
            chunks[-1] = f"{chunks[-1]} {part}"
        else:
            chunks.append(part)
    return chunks


def _normalised(matrix: Any) -> Any:
    import numpy as np

    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)
