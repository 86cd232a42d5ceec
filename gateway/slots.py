"""Which Valkey slot (hash tag) a key of admission lives in (docs/gateway-scheduling.md,
"Scale-out"): a model pool's, a tenant's, or the shared one. Apart from
gateway/scheduling/keys.py, which names the keys themselves, so that gateway.admission can
place its limits without importing the scheduler."""

from __future__ import annotations

KEY_PREFIX = "sy:{sy}:"


def pool_prefix(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The prefix of a model pool's slot: "sy:{sy}:" -> "sy:{sy/llama}:"."""
    return f"{_tag_stem(prefix)}/{model}}}:"


def account_prefix(tenant: str, *, prefix: str = KEY_PREFIX) -> str:
    """The prefix of a tenant's slot: "sy:{sy}:" -> "sy:{sy/@acme}:"."""
    return f"{_tag_stem(prefix)}/@{tenant}}}:"


def _tag_stem(prefix: str) -> str:
    if not prefix.endswith("}:") or "{" not in prefix:
        raise ValueError(f"a key prefix ends with its hash tag, as 'sy:{{sy}}:', not {prefix!r}")
    return prefix[:-2]


def rate_limit(limit_id: str, *, prefix: str = KEY_PREFIX) -> str:
    """A limit's counters' stem (limits.lua appends ":<window-index>"); ``prefix``: the
    slot the limit lives in (gateway.admission.limits_for chooses)."""
    return f"{prefix}rl:{limit_id}"
