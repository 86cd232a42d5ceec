"""secrets: provider tokens, private keys and passwords are found with the secret's span;
placeholders, hashes and ids in documentation and code samples are not."""

from __future__ import annotations

import pytest

from guardrails.base import SettingsError
from guardrails.detectors.secrets import ENTITIES, SecretsDetector
from guardrails.engine import redact


@pytest.fixture(scope="module")
def secrets(engine) -> SecretsDetector:
    detector = engine.detector("secrets")
    assert isinstance(detector, SecretsDetector)
    return detector


GITHUB = "ghp_4kT9mQ2xR7vL1pZ8sW3yN6bC0dF5hJ2gK9aE"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwia"
    "WF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----"
)


@pytest.mark.parametrize(
    ("text", "entity", "secret"),
    [
        ("my key AKIAZ3MSJV4WWNKWW5QX fails", "AWS_KEY", "AKIAZ3MSJV4WWNKWW5QX"),
        (f"export GITHUB_TOKEN={GITHUB}\ngit push", "GITHUB_TOKEN", GITHUB),
        (f"Authorization: Bearer {JWT}\nwhy 401?", "JWT", JWT),
        (
            "stripe.api_key = 'sk_live_51HtQ2mKp9LrT4vW7yB1nC3dE5gH6jS0aU2iO4kL8'",
            "STRIPE_KEY",
            "sk_live_51HtQ2mKp9LrT4vW7yB1nC3dE5gH6jS0aU2iO4kL8",
        ),
        (
            "key=sk-proj-Zx8fK2mQp9LrT4vW7yB1nC3dE5gH6jS0aU2iO4kL8mN1bV3cX5zA7sD9fG now",
            "OPENAI_KEY",
            "sk-proj-Zx8fK2mQp9LrT4vW7yB1nC3dE5gH6jS0aU2iO4kL8mN1bV3cX5zA7sD9fG",
        ),
        (
            "call the gateway with sk-sy-Qm7xK2pL9rT4vW1yB8nC3dE5gH6jS0aU2iO4kL8mN1b please",
            "SWITCHYARD_KEY",
            "sk-sy-Qm7xK2pL9rT4vW1yB8nC3dE5gH6jS0aU2iO4kL8mN1b",
        ),
        ("postgres://app:Vx9#mQ2rLp7@db.internal:5432/x", "URL_PASSWORD", "Vx9#mQ2rLp7"),
        ('password = "Tr0ub4dor&3horse"  # why?', "SECRET_ASSIGNMENT", "Tr0ub4dor&3horse"),
        ("SMTP_PASSWORD=hunter2Xq9 is in our .env", "SECRET_ASSIGNMENT", "hunter2Xq9"),
        (f"fix the login:\n{PRIVATE_KEY}\nthanks", "PRIVATE_KEY", PRIVATE_KEY),
        # A cloud secret as an unquoted config line; a value of the provider's exact format is
        # a secret whatever word is inside it (an officer allows a known public sample by value).
        (
            "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nwhy 403?",
            "AWS_KEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ("The AWS docs use AKIAIOSFODNN7EXAMPLE as a key id.", "AWS_KEY", "AKIAIOSFODNN7EXAMPLE"),
        # An incoming-webhook URL is the credential: its path carries the token.
        (
            "post to https://discord.com/api/webhooks/1234567890123/AbCdEfGhIjKlMnOpQrStUvWx_y now",
            "WEBHOOK_URL",
            "https://discord.com/api/webhooks/1234567890123/AbCdEfGhIjKlMnOpQrStUvWx_y",
        ),
        (
            "Teams: https://contoso.webhook.office.com/webhookb2/1a2b3c4d-1111-2222-3333-4444555566"
            "66@aaaabbbb-cccc/IncomingWebhook/0123456789abcdef0123456789abcdef/9999",
            "WEBHOOK_URL",
            "https://contoso.webhook.office.com/webhookb2/1a2b3c4d-1111-2222-3333-4444555566"
            "66@aaaabbbb-cccc/IncomingWebhook/0123456789abcdef0123456789abcdef/9999",
        ),
        # A password given in words.
        ("my password is Tr0ub4dor&3 so log in", "SECRET_ASSIGNMENT", "Tr0ub4dor&3"),
        ("The admin password for the lab box is hunter2, reset it", "SECRET_ASSIGNMENT", "hunter2"),
        ("Use the password 'Winter2024!' for the VPN.", "SECRET_ASSIGNMENT", "Winter2024!"),
        ("Mitt lösenord är Sommar2024! tack", "SECRET_ASSIGNMENT", "Sommar2024!"),
    ],
)
def test_a_secret_is_named_and_its_span_is_the_secret(secrets, text, entity, secret):
    """GIVEN a prompt that carries one credential
    WHEN it is checked
    THEN one finding names its kind and spans exactly the credential, so redaction keeps the
    rest of the prompt readable."""
    findings = secrets.check(text, secrets.validate({}))
    assert [(f.entity, text[f.start : f.end]) for f in findings] == [(entity, secret)]
    assert redact(text, findings) == text.replace(secret, f"<{entity}>")


@pytest.mark.parametrize(
    "text",
    [
        'client = OpenAI(api_key="YOUR_API_KEY")  # replace with your key',
        "export OPENAI_API_KEY=sk-...  then run the script.",
        'password = os.environ["DB_PASSWORD"]',
        "Our password policy requires 12 characters, one digit and one symbol.",
        "api_key: ${API_KEY}",
        'token = "<paste token here>"',
        "password: please reset it through the self-service portal",
        "The commit 9fceb02d0ae598e95dc970b74767f19372d61af8 introduced the bug.",
        "Request 550e8400-e29b-41d4-a716-446655440000 timed out.",
        'Convert this JSON to YAML: {"name": "ledger", "replicas": 3}',
        "-----BEGIN PUBLIC KEY----- blocks are safe to share.",
        "The password is stored in Vault and rotated monthly.",
        "Your password must be at least 12 characters long.",
        "Set the password to something memorable, then log in.",
        "Please reset my password, I forgot it.",
        "The webhook posts to https://hooks.example.com/notify when a job ends.",
    ],
)
def test_placeholders_hashes_and_ids_are_not_secrets(secrets, text):
    assert secrets.check(text, secrets.validate({})) == []


def test_one_credential_seen_by_several_plugins_is_one_finding(secrets):
    """A Stripe key in an assignment is also a keyword hit and a high-entropy string: it is
    reported once, by its most specific name."""
    text = 'STRIPE_SECRET = "sk_live_51HtQ2mKp9LrT4vW7yB1nC3dE5gH6jS0aU2iO4kL8"'
    assert [f.entity for f in secrets.check(text, secrets.validate({}))] == ["STRIPE_KEY"]


def test_kinds_and_allow_narrow_what_is_reported(secrets):
    text = f"AKIAZ3MSJV4WWNKWW5QX and {GITHUB}"
    only_github = secrets.validate({"kinds": ["GITHUB_TOKEN"]})
    assert [f.entity for f in secrets.check(text, only_github)] == ["GITHUB_TOKEN"]
    allowed = secrets.validate({"allow": ["AKIAZ3MSJV4WWNKWW5QX"]})
    assert [f.entity for f in secrets.check(text, allowed)] == ["GITHUB_TOKEN"]


def test_offsets_hold_on_later_lines(secrets):
    text = "line one\nline two\r\n" + f"token {GITHUB} end"
    [finding] = secrets.check(text, secrets.validate({}))
    assert text[finding.start : finding.end] == GITHUB


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"kinds": ["PASSWORDS"]}, "kinds"),
        ({"kinds": "JWT"}, "kinds"),
        ({"allow": [1]}, "allow"),
        ({"entropy": True}, "entropy"),
    ],
)
def test_bad_settings_name_the_field(secrets, settings, field):
    with pytest.raises(SettingsError, match=field):
        secrets.validate(settings)


def test_defaults_report_every_kind():
    assert SecretsDetector().validate({}) == {"kinds": list(ENTITIES), "allow": []}
