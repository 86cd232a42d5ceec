"""Secrets and credentials: Yelp's ``detect-secrets`` plugins, run on a prompt line by line.

detect-secrets is built to scan files in a repository; here its plugins are driven directly:
the provider plugins (AWS, GitHub, GitLab, Slack, Stripe, OpenAI, JWT, private keys, …) by
their own patterns, so each finding has the whole token's span; the keyword plugin with both
its quoted-assignment rules (code) and its config rules (``password: …`` in YAML, .env, INI);
the high-entropy plugins on quoted strings; its heuristic filters (UUIDs, ids, templates,
``$VARIABLES``) on every candidate. A few token formats detect-secrets 1.5 does not know are
added from their providers' published formats (OpenAI project keys, Anthropic, Google, Hugging
Face, GitHub fine-grained tokens, Switchyard's own ``sk-sy-`` keys).

Placeholders are not secrets: ``YOUR_API_KEY``, ``sk-...``, ``<token>``, ``xxxx`` and values
that say "example" are dropped, so documentation and code samples pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields

PRIVATE_KEY = "PRIVATE_KEY"
# entity names, not credentials
SECRET_ASSIGNMENT = "SECRET_ASSIGNMENT"  # noqa: S105
URL_PASSWORD = "URL_PASSWORD"  # noqa: S105
WEBHOOK_URL = "WEBHOOK_URL"
HIGH_ENTROPY_STRING = "HIGH_ENTROPY_STRING"

#: detect-secrets plugin → entity (the IP-address plugin is PII, not a secret: left out)
_PLUGINS: dict[str, str] = {
    "AWSKeyDetector": "AWS_KEY",
    "ArtifactoryDetector": "ARTIFACTORY_TOKEN",
    "AzureStorageKeyDetector": "AZURE_STORAGE_KEY",
    "CloudantDetector": "CLOUDANT_KEY",
    "DiscordBotTokenDetector": "DISCORD_TOKEN",
    "GitHubTokenDetector": "GITHUB_TOKEN",
    "GitLabTokenDetector": "GITLAB_TOKEN",
    "IbmCloudIamDetector": "IBM_CLOUD_KEY",
    "IbmCosHmacDetector": "IBM_CLOUD_KEY",
    "JwtTokenDetector": "JWT",
    "MailchimpDetector": "MAILCHIMP_KEY",
    "NpmDetector": "NPM_TOKEN",
    "OpenAIDetector": "OPENAI_KEY",
    "PrivateKeyDetector": PRIVATE_KEY,
    "PypiTokenDetector": "PYPI_TOKEN",
    "SendGridDetector": "SENDGRID_KEY",
    "SlackDetector": "SLACK_TOKEN",
    "SoftlayerDetector": "SOFTLAYER_KEY",
    "SquareOAuthDetector": "SQUARE_TOKEN",
    "StripeDetector": "STRIPE_KEY",
    "TelegramBotTokenDetector": "TELEGRAM_TOKEN",
    "TwilioKeyDetector": "TWILIO_KEY",
    "BasicAuthDetector": URL_PASSWORD,
}

#: formats detect-secrets 1.5 lacks (providers' documented prefixes and lengths)
_EXTRA: tuple[tuple[str, str], ...] = (
    ("OPENAI_KEY", r"\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}"),
    ("ANTHROPIC_KEY", r"\bsk-ant-[a-z]{3,5}\d{2}-[A-Za-z0-9_-]{80,}"),
    ("GOOGLE_API_KEY", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
    ("HUGGINGFACE_TOKEN", r"\bhf_[A-Za-z0-9]{34,}"),
    ("GITHUB_TOKEN", r"\bgithub_pat_[A-Za-z0-9_]{60,}"),
    ("SWITCHYARD_KEY", r"\bsk-sy-[A-Za-z0-9_-]{40,}"),
    # user:password@ in any URL, the password as people paste it (detect-secrets' plugin
    # follows RFC 3986 and misses a password with an unencoded # or !)
    (URL_PASSWORD, r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:([^\s@/]{3,})@"),
    # AWS's secret access key as a config line, quoted or not (detect-secrets wants quotes)
    (
        "AWS_KEY",
        r"(?i:aws_?secret(?:_?access)?_?key)\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
    ),
    # Chat services' incoming-webhook URLs: the URL is the credential (its path or query
    # carries the token). Slack's are detect-secrets' SLACK_TOKEN.
    (
        WEBHOOK_URL,
        r"https://(?:[a-z0-9-]+\.)?(?:discord(?:app)?\.com)/api/webhooks/\d{5,}/[A-Za-z0-9_-]{20,}",
    ),
    (WEBHOOK_URL, r"https://[a-z0-9-]+\.webhook\.office\.com/webhookb2/[^\s\"'<>]{40,}"),
    (WEBHOOK_URL, r"https://outlook\.office(?:365)?\.com/webhook/[^\s\"'<>]{40,}"),
    (WEBHOOK_URL, r"https://[a-z0-9-]+\.logic\.azure\.com[^\s\"'<>]*[?&]sig=[A-Za-z0-9_%-]{20,}"),
    (
        WEBHOOK_URL,
        r"https://chat\.googleapis\.com/v1/spaces/[^\s\"'<>]*[?&]token=[A-Za-z0-9_%=-]{20,}[^\s\"'<>]*",
    ),
    (WEBHOOK_URL, r"https://hooks\.zapier\.com/hooks/catch/\d+/[A-Za-z0-9]{5,}/?"),
    (WEBHOOK_URL, r"https://[^\s/\"'<>]+/hooks/[a-z0-9]{26}(?![A-Za-z0-9])"),
)

#: a password given in words: "my password is Tr0ub4dor&3", "the VPN password for the lab is
#: 'Winter2024!'", in the languages of the PII detector's names too. The value is reported only
#: if it is not a plain word (``_looks_secret``): "the password is stored in Vault" passes.
_PROSE_PASSWORD = regex.compile(
    r"(?i)\b(?:password|passwd|passphrase|passcode|pwd|pin code|mot de passe|passwort|kennwort"
    r"|contrase[ñn]a|senha|wachtwoord|l[öo]senord|salasana|adgangskode|passord|has[łl]o)\b"
    r"[^\n.?!:=]{0,40}?"
    r"(?:\s(?:is|was|are|is now|will be|set to|changed to|reset to|ist|est|es|er|är|on|jest|è)\s+"
    r"|\s*[:=]\s*|\s+(?=[\"'`“‘«]))"
    r"[\"'`“‘«]?(?P<value>[^\s\"'`”’»,;]{4,64})"
)

_PRIVATE_KEY_BLOCK = regex.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
    r".*?(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    regex.DOTALL,
)

#: more specific names win when two plugins see the same characters
_GENERIC_RANK = {URL_PASSWORD: 1, SECRET_ASSIGNMENT: 2, HIGH_ENTROPY_STRING: 3}

ENTITIES: tuple[str, ...] = tuple(
    sorted({*_PLUGINS.values(), *(name for name, _ in _EXTRA), SECRET_ASSIGNMENT,
            HIGH_ENTROPY_STRING, WEBHOOK_URL})
)  # fmt: skip

#: what marks a value written for the reader to fill in, in any shape
_FILL_IN = (
    r"your[_-]?(?:api[_-]?)?(?:key|token|secret|password)|redacted|changeme|insert|replace"
    r"|\.\.\.|…|xxxx|\*\*\*|<[^>]*>|\{\{|\$\{|%\(|^(.)\1+$"
)
_PLACEHOLDER = regex.compile(r"example|placeholder|dummy|sample|" + _FILL_IN, regex.IGNORECASE)
#: in a value of a provider's exact format, a word such as "EXAMPLE" is no sign of a fake: real
#: keys are random, and AWS's documented example keys work as well as any to leak a habit
_FORMAT_PLACEHOLDER = regex.compile(_FILL_IN, regex.IGNORECASE)
_TOKEN_TAIL = regex.compile(r"[A-Za-z0-9_\-+/=]*")


def is_placeholder(value: str, marks: regex.Pattern[str] = _PLACEHOLDER) -> bool:
    stripped = value.strip("'\"`")
    return len(stripped) < 6 or marks.search(stripped) is not None


def _looks_secret(value: str) -> bool:
    """An unquoted config value is a secret only if it is not a plain word ("password: please
    reset it"): it has a digit, a symbol, or mixed case."""
    return bool(value) and (
        any(c.isdigit() for c in value)
        or not value.isalnum()
        or (value.lower() != value and value.upper() != value)
    )


class SecretsDetector:
    """API keys and tokens of the common providers, private keys, passwords in assignments and
    URLs, and high-entropy quoted strings; spans for redaction."""

    name: ClassVar[str] = "secrets"

    def __init__(self) -> None:
        self._regex_plugins: list[tuple[str, list[Any]]] = []
        self._keyword: Any = None
        self._entropy: list[Any] = []
        self._rules: list[dict[Any, int]] = []
        self._filters: list[Callable[[str, str, Any], bool]] = []
        self._extra = [(name, regex.compile(pattern)) for name, pattern in _EXTRA]

    def load(self) -> None:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.filters import heuristic
        from detect_secrets.plugins.high_entropy_strings import (
            Base64HighEntropyString,
            HexHighEntropyString,
        )
        from detect_secrets.plugins.keyword import (
            CONFIG_DENYLIST_REGEX_TO_GROUP,
            QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
            KeywordDetector,
        )

        plugins: Any = get_mapping_from_secret_type_to_class().values()
        classes: dict[str, Any] = {cls.__name__: cls for cls in plugins}
        self._regex_plugins = [
            (entity, list(classes[name]().denylist)) for name, entity in _PLUGINS.items()
        ]
        self._keyword = KeywordDetector()
        self._rules = [QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP, CONFIG_DENYLIST_REGEX_TO_GROUP]
        # detect-secrets' own default limits for the two entropy plugins
        self._entropy = [Base64HighEntropyString(limit=4.5), HexHighEntropyString(limit=3.0)]
        # detect-secrets' default heuristic filters (those that apply to a string, not a file)
        self._filters = [
            lambda secret, line, plugin: heuristic.is_sequential_string(secret),
            lambda secret, line, plugin: heuristic.is_potential_uuid(secret),
            heuristic.is_likely_id_string,
            lambda secret, line, plugin: heuristic.is_templated_secret(secret),
            lambda secret, line, plugin: heuristic.is_prefixed_with_dollar_sign(secret),
            lambda secret, line, plugin: heuristic.is_indirect_reference(line),
            lambda secret, line, plugin: heuristic.is_not_alphanumeric_string(secret),
        ]

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("kinds", "allow"))
        return {
            "kinds": fields.choices(settings, "kinds", ENTITIES, ENTITIES),
            "allow": fields.strings(settings, "allow", (), max_items=100, max_length=500),
        }

    def _filtered(self, secret: str, line: str, plugin: Any) -> bool:
        return is_placeholder(secret) or any(f(secret, line, plugin) for f in self._filters)

    def _line(self, line: str, offset: int) -> Iterator[Finding]:
        for entity, patterns in self._regex_plugins:
            for pattern in patterns:
                for match in pattern.finditer(line):
                    group = match.lastindex or 0
                    if group and match.end(group) - match.start(group) < 6:
                        group = 0  # a short group is a prefix ("ghp"), not the secret
                    start, end = match.span(group)
                    end = _TOKEN_TAIL.match(line, end).end()  # type: ignore[union-attr]
                    value = line[start:end].strip()
                    if value and not is_placeholder(value, _FORMAT_PLACEHOLDER):
                        yield Finding(entity, 1.0, offset + start, offset + start + len(value))
        for entity, pattern in self._extra:
            for match in pattern.finditer(line):
                start, end = match.span(match.lastindex or 0)
                if not is_placeholder(line[start:end], _FORMAT_PLACEHOLDER):
                    yield Finding(entity, 1.0, offset + start, offset + end)
        for match in _PROSE_PASSWORD.finditer(line):
            value = match["value"].rstrip(".)")
            if _looks_secret(value) and not self._filtered(value, line, self._keyword):
                start = match.start("value")
                yield Finding(SECRET_ASSIGNMENT, 0.8, offset + start, offset + start + len(value))
        for rules in self._rules:
            quoted = rules is self._rules[0]
            for secret in self._keyword.analyze_string(line, denylist_regex_to_group=rules):
                value = secret.strip("'\"`")
                if not quoted:
                    # A config value runs to the end of the line: the secret is its first word.
                    value = (value.split() or [""])[0].rstrip(",;")
                    if not _looks_secret(value):
                        continue
                if self._filtered(value, line, self._keyword):
                    continue
                at = line.find(value)
                if at >= 0:
                    yield Finding(SECRET_ASSIGNMENT, 0.9, offset + at, offset + at + len(value))
        for plugin in self._entropy:
            # analyze_line, not analyze_string: the entropy limit is applied there
            for potential in plugin.analyze_line(filename="prompt", line=line):
                secret = potential.secret_value or ""
                if self._filtered(secret, line, plugin):
                    continue
                at = line.find(secret)
                if at >= 0:
                    yield Finding(HIGH_ENTROPY_STRING, 0.7, offset + at, offset + at + len(secret))

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        if self._keyword is None:
            self.load()
        kinds = frozenset(settings.get("kinds", ENTITIES))
        allow = frozenset(settings.get("allow", ()))
        candidates = [
            Finding(PRIVATE_KEY, 1.0, m.start(), m.end()) for m in _PRIVATE_KEY_BLOCK.finditer(text)
        ]
        offset = 0
        for line in text.splitlines(keepends=True):
            if line.strip():
                candidates.extend(self._line(line, offset))
            offset += len(line)
        # One finding per secret: the most specific name, the widest span among equals.
        candidates.sort(
            key=lambda f: (_GENERIC_RANK.get(f.entity, 0), -((f.end or 0) - (f.start or 0)))
        )
        kept: list[Finding] = []
        for finding in candidates:
            if not any(_overlap(finding, other) for other in kept):
                kept.append(finding)
        return sorted(
            (f for f in kept if f.entity in kinds and text[f.start : f.end] not in allow),
            key=lambda f: f.start or 0,
        )


def _overlap(a: Finding, b: Finding) -> bool:
    return (a.start or 0) < (b.end or 0) and (b.start or 0) < (a.end or 0)
