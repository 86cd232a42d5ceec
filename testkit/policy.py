"""Publish policy snapshots straight to Valkey, for gateway tests that need no database.

The governance side's own publisher is tested against the database separately
(tests/governance/test_snapshot.py) and end to end through the stack.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

import valkey

from gateway.policy import (
    SCHEMA,
    VERSION_KEY,
    KeyEntry,
    ModelCapability,
    ModelEntry,
    PriorityClassEntry,
    RateLimitEntry,
    RecordPolicy,
    ServiceAccountEntry,
    UseCaseEntry,
    snapshot_write,
)


@dataclass
class PolicyBuilder:
    """A tenant world for one test: models, keys (plaintext kept for the test's use) and
    Keycloak clients bound to use cases (service accounts)."""

    models: dict[str, ModelEntry] = field(default_factory=dict)
    keys: dict[str, KeyEntry] = field(default_factory=dict)
    service_accounts: dict[str, ServiceAccountEntry] = field(default_factory=dict)
    priority_classes: dict[str, PriorityClassEntry] = field(default_factory=dict)
    use_cases: dict[str, UseCaseEntry] = field(default_factory=dict)
    rate_limits: list[RateLimitEntry] = field(default_factory=list)
    _next_id: int = 1

    def model(
        self,
        public_id: str,
        replicas: list[str],
        *,
        capabilities: tuple[ModelCapability, ...] = ("chat", "completions"),
        served_name: str | None = None,
        timeout_s: float = 30.0,
        max_in_flight_per_replica: int | None = None,
        max_tokens: int | None = None,
        deployments: list[tuple[str, list[str]]] | None = None,
    ) -> PolicyBuilder:
        """``deployments``: (served name, replicas) pairs, for a model deployed more than
        once; ``replicas`` and ``served_name`` then say what governance publishes beside them
        (every replica, the first deployment's name)."""
        self.models[public_id] = {
            "served_name": served_name or public_id,
            "capabilities": list(capabilities),
            "replicas": replicas,
            "timeout_s": timeout_s,
            "max_tokens": max_tokens,
        }
        if deployments is not None:
            self.models[public_id]["deployments"] = [
                {"served_name": name, "replicas": urls} for name, urls in deployments
            ]
        if max_in_flight_per_replica is not None:
            self.models[public_id]["max_in_flight_per_replica"] = max_in_flight_per_replica
        return self

    def lifecycle(
        self,
        public_id: str,
        *,
        status: Literal["deprecated", "retired"] = "deprecated",
        sunset_at: float | None,
        successor: str | None,
        at_sunset: Literal["refuse", "successor"] = "refuse",
        notice_url: str = "",
        deprecated_at: float | None = None,
    ) -> PolicyBuilder:
        """Deprecate (or retire) a model already added, as governance publishes it."""
        self.models[public_id]["lifecycle"] = {
            "status": status,
            "deprecated_at": time.time() if deprecated_at is None else deprecated_at,
            "sunset_at": sunset_at,
            "successor": successor,
            "notice_url": notice_url,
            "at_sunset": at_sunset,
        }
        return self

    def versions(
        self,
        public_id: str,
        versions: dict[str, list[str]],
        *,
        split: dict[str, int] | None = None,
        sticky: Literal["request", "use_case"] = "request",
        aliases: dict[str, str] | None = None,
        served_name: str | None = None,
        served_names: dict[str, str] | None = None,
        capabilities: tuple[ModelCapability, ...] = ("chat", "completions"),
    ) -> PolicyBuilder:
        """A model with versions (``versions``: label -> replicas), as governance publishes
        it: the model's entry with its routing, and one entry ``<model>@<label>`` each.
        ``served_names``: a version's served name where it is not ``served_name``."""
        labels = list(versions)
        # Every version's replicas on the model's own entry too, as governance publishes it
        # (for gateways from before versions); a gateway that knows routing never uses them.
        every = [url for replicas in versions.values() for url in replicas]
        self.model(public_id, every, capabilities=capabilities, served_name=served_name)
        self.models[public_id]["routing"] = {
            "versions": sorted(labels),
            "split": [(v, w) for v, w in sorted((split or {labels[0]: 1}).items()) if w > 0],
            "sticky": sticky,
            "aliases": dict(aliases or {}),
        }
        for label, replicas in versions.items():
            name = f"{public_id}@{label}"
            served = (served_names or {}).get(label) or served_name or public_id
            self.model(name, replicas, capabilities=capabilities, served_name=served)
            self.models[name]["deployments"] = [{"served_name": served, "replicas": replicas}]
            self.models[name]["version_of"] = public_id
            self.models[name]["version"] = label
        return self

    def fallbacks(self, plaintext: str, model: str, chain: list[str]) -> PolicyBuilder:
        """The models that serve the key's use case when ``model`` refuses for capacity."""
        self._use_case(plaintext).setdefault("model_fallbacks", {})[model] = chain
        return self

    def pin(self, plaintext: str, model: str, target: str) -> PolicyBuilder:
        """Pin the key's use case to a version or alias of ``model``."""
        self._use_case(plaintext).setdefault("model_pins", {})[model] = target
        return self

    def key(
        self,
        *,
        tenant: str = "acme",
        use_case: str = "chatbot",
        models: list[str] | None = None,
        environment: str = "prod",
        namespace: str = "prod",
        expires_at: float | None = None,
        priority_class: str | None = None,
    ) -> str:
        plaintext = "sk-sy-" + secrets.token_urlsafe(32)
        key_id = self._next_id
        self._next_id += 1
        self.keys[hashlib.sha256(plaintext.encode()).hexdigest()] = {
            "key_id": key_id,
            "prefix": plaintext[:12],
            "tenant": tenant,
            "tenant_id": abs(hash(tenant)) % 10_000,
            "environment": environment,
            "use_case": use_case,
            "use_case_id": key_id,
            "namespace": namespace,
            "models": list(self.models) if models is None else models,
            "expires_at": expires_at,
            "priority_class": priority_class,
        }
        return plaintext

    def service_account(self, client_id: str, *, like: str) -> PolicyBuilder:
        """Bind a Keycloak client to the use case of the key ``like`` (a plaintext): its
        service-account tokens then act as that use case, with the same tenant, models,
        namespace and priority class, as the snapshot of an approved use case says."""
        entry = self.keys[hashlib.sha256(like.encode()).hexdigest()]
        self.service_accounts[client_id] = {
            "tenant": entry["tenant"],
            "tenant_id": entry["tenant_id"],
            "environment": entry["environment"],
            "use_case": entry["use_case"],
            "use_case_id": entry["use_case_id"],
            "namespace": entry["namespace"],
            "models": list(entry["models"]),
            "priority_class": entry.get("priority_class"),
        }
        return self

    def unbind(self, client_id: str) -> None:
        """What a suspended (or unbound) use case looks like to the gateway: no entry."""
        del self.service_accounts[client_id]

    def priority_class(
        self,
        name: str,
        *,
        rank: int,
        vllm_priority: int | None = None,
        queue_timeout_s: float = 30.0,
        max_queue_length: int = 1000,
        max_pool_share: float = 1.0,
        degrade_after_s: float | None = None,
    ) -> PolicyBuilder:
        self.priority_classes[name] = {
            "rank": rank,
            "vllm_priority": rank if vllm_priority is None else vllm_priority,
            "queue_timeout_s": queue_timeout_s,
            "max_queue_length": max_queue_length,
            "max_pool_share": max_pool_share,
        }
        if degrade_after_s is not None:
            self.priority_classes[name]["degrade_after_s"] = degrade_after_s
        return self

    def use_case_limits(self, plaintext: str, **limits: int | None) -> PolicyBuilder:
        """Give the key's use case limits (requests_per_minute, tokens_per_minute, …)."""
        entry = self.keys[hashlib.sha256(plaintext.encode()).hexdigest()]
        before = self.use_cases.get(str(entry["use_case_id"]))
        self.use_cases[str(entry["use_case_id"])] = {
            "tenant": entry["tenant"],
            "slug": entry["use_case"],
            "limits": {
                "requests_per_minute": limits.get("requests_per_minute"),
                "tokens_per_minute": limits.get("tokens_per_minute"),
                "tokens_per_day": limits.get("tokens_per_day"),
                "max_concurrent": limits.get("max_concurrent"),
            },
            "guardrails": before["guardrails"] if before else [],
        }
        if before and "guardrail_failure" in before:
            self.use_cases[str(entry["use_case_id"])]["guardrail_failure"] = before[
                "guardrail_failure"
            ]
        if before and "record" in before:
            self.use_cases[str(entry["use_case_id"])]["record"] = before["record"]
        return self

    def _use_case(self, plaintext: str) -> UseCaseEntry:
        entry = self.keys[hashlib.sha256(plaintext.encode()).hexdigest()]
        use_case = self.use_cases.get(str(entry["use_case_id"]))
        if use_case is None:
            self.use_case_limits(plaintext)
            use_case = self.use_cases[str(entry["use_case_id"])]
        return use_case

    def guardrail(
        self,
        plaintext: str,
        guardrail: str,
        *,
        side: Literal["request", "response", "both"] = "request",
        action: Literal["block", "redact", "flag"] = "block",
        config: dict[str, object] | None = None,
    ) -> PolicyBuilder:
        """Add a guardrail selection to the key's use case (they run in the order added)."""
        self._use_case(plaintext)["guardrails"].append(
            {"guardrail": guardrail, "side": side, "action": action, "config": config or {}}
        )
        return self

    def guardrail_failure(self, plaintext: str, mode: Literal["closed", "open"]) -> PolicyBuilder:
        """What the key's use case does when a guardrail cannot run."""
        self._use_case(plaintext)["guardrail_failure"] = mode
        return self

    def record(self, plaintext: str, policy: RecordPolicy) -> PolicyBuilder:
        """What the key's use case keeps of each request: none, metadata or full."""
        self._use_case(plaintext)["record"] = policy
        return self

    def use_case_id(self, plaintext: str) -> int:
        """The id of the key's use case (what its ``uc:<id>:…`` limit counters are named by)."""
        return self.keys[hashlib.sha256(plaintext.encode()).hexdigest()]["use_case_id"]

    def revoke(self, plaintext: str) -> None:
        del self.keys[hashlib.sha256(plaintext.encode()).hexdigest()]

    def stop_use_case(self, plaintext: str) -> None:
        """What governance publishes once an officer suspends or retires the key's use case
        (governance/snapshot.py keeps approved use cases only): none of its keys — API, job
        and playground keys alike — none of its clients, and no entry of its own."""
        use_case_id = self.use_case_id(plaintext)
        for key_hash, entry in list(self.keys.items()):
            if entry["use_case_id"] == use_case_id:
                del self.keys[key_hash]
        for client_id, account in list(self.service_accounts.items()):
            if account["use_case_id"] == use_case_id:
                del self.service_accounts[client_id]
        self.use_cases.pop(str(use_case_id), None)

    def rate_limit(
        self,
        name: str,
        scope: Literal["global", "model", "tenant", "tenant_model"],
        *,
        model: str | None = None,
        tenant: str | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        tokens_per_day: int | None = None,
    ) -> PolicyBuilder:
        """A rate-limit policy row (an officer's RateLimitPolicy): for everyone, one model, one
        tenant, or one tenant on one model. Checked in the order added."""
        self.rate_limits.append(
            {
                "name": name,
                "scope": scope,
                "model": model,
                "tenant": tenant,
                "requests_per_minute": requests_per_minute,
                "tokens_per_minute": tokens_per_minute,
                "tokens_per_day": tokens_per_day,
            }
        )
        return self

    def publish(self, client: valkey.Valkey) -> int:
        version = int(client.incr(VERSION_KEY + ":test"))  # type: ignore[arg-type]
        snapshot_write(
            client,
            {
                "schema": SCHEMA,
                "version": version,
                "published_at": time.time(),
                "models": self.models,
                "keys": self.keys,
                "service_accounts": self.service_accounts,
                "priority_classes": self.priority_classes,
                "use_cases": self.use_cases,
                "rate_limits": self.rate_limits,
            },
        )
        return version
