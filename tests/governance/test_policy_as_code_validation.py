"""Policy files are checked on their own, with every problem reported at its place in the file."""

from __future__ import annotations

import copy
from io import StringIO
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.schema import policy_load, policy_parse

# A company's own guardrails (testkit/detectors.py), selected like the built-in ones.
pytestmark = pytest.mark.usefixtures("company_guardrails")


def acme_policy() -> dict[str, Any]:
    """Acme's retail chatbot on one model: valid as it stands; tests spoil one part of it."""
    return {
        "version": 1,
        "models": [
            {
                "id": "llama",
                "capabilities": ["chat"],
                "timeout_seconds": 20,
                "deployments": [{"served_name": "llama-8b", "replicas": ["http://10.0.0.1:8000"]}],
            }
        ],
        "tenants": [
            {
                "id": "acme",
                "name": "Acme retail",
                "business_unit": "Retail",
                "application_id": "APP-1000",
                "environment": "prod",
                "owner_email": "owner@acme.example",
            }
        ],
        "use_cases": [
            {
                "id": "acme/chatbot",
                "name": "Chatbot",
                "kind": "chatbot",
                "purpose": "Answers customers.",
                "status": "approved",
                "namespace": "prod",
                "models": ["llama"],
                "limits": {"tokens_per_minute": 1000},
                "guardrails": [
                    {
                        "guardrail": "wordlist",
                        "side": "request",
                        "action": "redact",
                        "config": {"words": ["falcon"]},
                    }
                ],
            }
        ],
        "rate_limits": [{"name": "fleet", "scope": "global", "requests_per_minute": 100}],
        "keys": [{"use_case": "acme/chatbot", "name": "ci"}],
    }


def problems_of(data: Any) -> set[str]:
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(data)
    return {str(problem) for problem in caught.value.problems}


def test_given_acme_policy_when_parsed_then_it_is_valid_and_typed() -> None:
    document = policy_parse(acme_policy())

    assert document.use_cases is not None
    chatbot = document.use_cases[0]
    assert (chatbot.tenant, chatbot.slug, chatbot.limits.tokens_per_minute) == (
        "acme",
        "chatbot",
        1000,
    )
    assert document.models is not None
    assert document.models[0].timeout_seconds == 20.0
    # Sections the file leaves out are not managed: None, not empty.
    assert document.priority_classes is None
    assert document.priority_matrix is None


def test_given_several_mistakes_when_validated_then_all_are_reported_with_their_paths() -> None:
    data = acme_policy()
    data["use_cases"][0]["limits"]["tokens_per_minute"] = 0
    data["use_cases"][0]["models"].append("gpt-9")
    data["use_cases"][0]["kind"] = "oracle"
    data["models"][0]["deployments"][0]["replicas"] = ["ftp://10.0.0.1"]
    data["tenants"].append(copy.deepcopy(data["tenants"][0]))
    data["tenants"][0]["environment"] = "production"
    data["tenants"][0]["owner"] = "someone"
    del data["tenants"][0]["owner_email"]
    data["rate_limits"][0]["scope"] = "model"

    problems = problems_of(data)

    assert problems == {
        "use_cases[acme/chatbot].limits.tokens_per_minute: must be a positive integer",
        "use_cases[acme/chatbot].models[1]: unknown model 'gpt-9' (not defined in the file)",
        "use_cases[acme/chatbot].kind: must be one of chatbot, agent, rag, extraction, batch, "
        "embeddings, transcription (got 'oracle')",
        "models[llama].deployments[llama-8b].replicas[0]: 'ftp://10.0.0.1' is not an http(s):// "
        "base URL with a host",
        "tenants[acme]: is defined twice (also tenants[acme])",
        "tenants[acme].environment: must be one of dev, test, uat, prod (got 'production')",
        "tenants[acme]: unknown field 'owner' (did you mean 'owner_email'?)",
        "tenants[acme].owner_email: is required",
        "rate_limits[fleet].model: is required",
    }


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (
            lambda d: d["use_cases"][0]["limits"].update(max_concurrent=-3),
            "use_cases[acme/chatbot].limits.max_concurrent: must be a positive integer",
        ),
        (
            lambda d: d["use_cases"][0]["limits"].update(tokens_per_minute=True),
            "use_cases[acme/chatbot].limits.tokens_per_minute: must be a positive integer",
        ),
        (
            lambda d: d["use_cases"][0].update(id="acme"),
            "use_cases[acme].id: must be tenant/slug, both in lowercase letters, digits and "
            "hyphens",
        ),
        (
            lambda d: d["use_cases"][0].update(id="globex/chatbot"),
            "use_cases[globex/chatbot].id: unknown tenant 'globex' (not defined in the file)",
        ),
        (
            lambda d: d["use_cases"][0]["guardrails"].append(
                {"guardrail": "wordlist", "side": "request", "action": "block"}
            ),
            "use_cases[acme/chatbot].guardrails[request:wordlist]: is defined twice "
            "(also use_cases[acme/chatbot].guardrails[request:wordlist])",
        ),
        (
            lambda d: d["use_cases"][0]["guardrails"][0].update(action="shout"),
            "use_cases[acme/chatbot].guardrails[request:wordlist].action: must be one of block, "
            "redact, flag (got 'shout')",
        ),
        (
            lambda d: d["models"][0].update(timeout_seconds=0),
            "models[llama].timeout_seconds: must be a number of seconds, at least 0.1",
        ),
        (
            lambda d: d["models"][0].update(capabilities=[]),
            "models[llama].capabilities: must list at least one entry",
        ),
        (
            lambda d: d["models"][0]["deployments"][0].update(replicas=["http://"]),
            "models[llama].deployments[llama-8b].replicas[0]: 'http://' is not an http(s):// "
            "base URL with a host",
        ),
        (
            lambda d: d["tenants"][0].update(application_id="app-1"),
            "tenants[acme].application_id: Use the CMDB form, e.g. APP-1234.",
        ),
        (
            lambda d: d["tenants"][0].update(id="Acme Retail"),
            "tenants[Acme Retail].id: Use lowercase letters, digits and hyphens (max 63).",
        ),
        (
            lambda d: d["rate_limits"][0].update(requests_per_minute=None),
            "rate_limits[fleet]: set at least one of requests_per_minute, tokens_per_minute, "
            "tokens_per_day",
        ),
        (
            lambda d: d["rate_limits"][0].update(tenant="acme"),
            "rate_limits[fleet].tenant: a global limit does not name a tenant",
        ),
        (
            lambda d: d["keys"].append({"use_case": "acme/chatbot", "name": "ci"}),
            "keys[1]: is defined twice (also keys[0])",
        ),
        (
            lambda d: d["keys"].append({"use_case": "acme/chatbot", "name": "x", "key": "sk-1"}),
            "keys[1]: keys are never written in the file; give use_case and name only",
        ),
        (
            lambda d: d.update(priority_matrix={"prod": {"prod": "urgent"}}, priority_classes=[]),
            "priority_matrix.prod.prod: unknown priority class 'urgent' (not defined in the file)",
        ),
        (
            lambda d: d.update(priority_matrix={"prod": {"staging": "low"}}),
            "priority_matrix.prod.staging: unknown namespace; use prod-dr, prod, demo, uat, qa, "
            "dev",
        ),
        (lambda d: d.update(version=2), "version: must be 1"),
        (lambda d: d.update(tenant=[]), "tenant: unknown section (did you mean 'tenants'?)"),
    ],
)
def test_given_one_mistake_when_validated_then_it_is_named_at_its_path(spoil, expected) -> None:
    data = acme_policy()
    spoil(data)
    assert expected in problems_of(data)


def test_given_a_key_twice_in_one_mapping_when_loaded_then_the_line_is_named() -> None:
    text = "version: 1\npriority_matrix:\n  prod: {prod: high}\n  prod: {prod: low}\n"
    with pytest.raises(PolicyInvalid) as caught:
        policy_load(text)
    assert [str(p) for p in caught.value.problems] == [
        "line 4, column 3: not valid YAML: found the key 'prod' twice"
    ]


def test_given_broken_yaml_when_loaded_then_the_line_is_named() -> None:
    with pytest.raises(
        PolicyInvalid, match=r"line 3, column 1: not valid YAML: expected the node content"
    ):
        policy_load("version: 1\nmodels: [\n")


def test_given_mistakes_when_the_command_validates_then_it_lists_them_and_exits_1(
    tmp_path,
) -> None:
    data = acme_policy()
    data["use_cases"][0]["limits"]["tokens_per_minute"] = "lots"
    data["models"][0]["timeout_seconds"] = -1
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    stderr = StringIO()

    with pytest.raises(CommandError, match="2 problems in") as caught:
        call_command("policy", "validate", str(path), stderr=stderr)

    assert caught.value.returncode == 1
    assert stderr.getvalue().splitlines()[1:] == [
        "  models[llama].timeout_seconds: must be a number of seconds, at least 0.1",
        "  use_cases[acme/chatbot].limits.tokens_per_minute: must be a positive integer",
    ]


def test_given_a_valid_file_when_the_command_validates_then_it_says_so(tmp_path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(acme_policy()))
    stdout = StringIO()
    call_command("policy", "validate", str(path), stdout=stdout)
    assert stdout.getvalue() == f"{path}: valid\n"
