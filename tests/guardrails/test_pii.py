"""pii: Presidio with spaCy from its PyPI package, offline; spans for redaction; custom
patterns per use case, bounded and guarded against catastrophic backtracking."""

from __future__ import annotations

import json
import socket

import pytest

from guardrails.base import SettingsError
from guardrails.detectors.pii import (
    DEFAULT_ENTITIES,
    SUPPORTED_ENTITIES,
    UNUSED_COMPONENTS,
    PatternTimeout,
    PiiDetector,
)
from guardrails.engine import redact
from testkit.guardrail_quality import SETTINGS, load_prompts


@pytest.fixture(scope="module")
def pii(engine) -> PiiDetector:
    detector = engine.detector("pii")
    assert isinstance(detector, PiiDetector)
    return detector


@pytest.mark.parametrize(
    ("template", "entity", "value"),
    [
        ("Forward this to {} today.", "EMAIL_ADDRESS", "jane.doe@northwind-bank.com"),
        ("Reach me on my mobile phone at {} after 6pm.", "PHONE_NUMBER", "(415) 555-0132"),
        ("Card number {} was declined.", "CREDIT_CARD", "4111 1111 1111 1111"),
        ("Wire it to IBAN {} by Friday.", "IBAN_CODE", "GB82 WEST 1234 5698 7654 32"),
        ("Users from {} keep failing login.", "IP_ADDRESS", "203.0.113.45"),
        ("The applicant's SSN is {}.", "US_SSN", "536-22-8147"),
        ("Her ITIN is {}, can she open an account?", "US_ITIN", "912-78-4567"),
        ("The patient's NHS number is {}.", "UK_NHS", "943 476 5919"),
        ("Pay to bitcoin wallet {} now.", "CRYPTO", "1BoatSLRHtKNngkdXEeobR76b53LETtpyT"),
        ("Write a birthday note for {} on the trading desk.", "PERSON", "Tom Becker"),
    ],
)
def test_each_default_entity_is_found_with_its_span(pii, template, entity, value):
    text = template.format(value)
    findings = pii.check(text, pii.validate({}))
    assert [(f.entity, text[f.start : f.end]) for f in findings] == [(entity, value)]
    assert redact(text, findings) == text.replace(value, f"<{entity}>")


def test_a_support_email_with_several_identifiers_is_redacted_whole(pii):
    """GIVEN a prompt with a name, an e-mail address and a phone number
    WHEN the pii check redacts it
    THEN each is replaced by its entity and nothing else changes."""
    text = "Draft a letter to David Kim (david.kim@fabrikam.com, 415-555-0175) about his balance."
    assert redact(text, pii.check(text, pii.validate({}))) == (
        "Draft a letter to <PERSON> (<EMAIL_ADDRESS>, <PHONE_NUMBER>) about his balance."
    )


@pytest.mark.parametrize(
    "text",
    [
        "Order #4111-2290 shipped on Monday; when will it arrive?",
        "Upgrade the SDK from version 3.11.4 to 3.12.0.",
        "Invoice INV-2023-00042 is overdue by 30 days.",
        "Convert 1500 euros to dollars at today's rate.",  # "Convert" is no one's name
        "The ticket JIRA-4521 tracks the login bug.",
        "Explain the difference between an IBAN and a SWIFT code.",
        "Necesito abrir una cuenta bancaria para mi empresa.",  # a foreign phrase is no name
        "The JAILBROKEN mode is not a feature we offer.",
        "I was at the corp office; email me at the office.",
        "Connect with postgres://app:Vx9#mQ2rLp7@db.prod.internal:5432/ledger",
    ],
)
def test_numbers_and_capitalised_words_that_are_not_personal_data_pass(pii, text):
    assert pii.check(text, pii.validate({})) == []


def test_an_itin_is_not_also_reported_as_an_ssn(pii):
    """Presidio's SSN recogniser matches an ITIN's shape too; one span is one entity."""
    text = "Her ITIN is 912-78-4567."
    assert [f.entity for f in pii.check(text, pii.validate({}))] == ["US_ITIN"]


def test_selected_entities_threshold_and_allow_list_narrow_the_findings(pii):
    text = "Ask Tom Becker to mail jane@contoso.com."
    emails = pii.validate({"entities": ["EMAIL_ADDRESS"]})
    assert [f.entity for f in pii.check(text, emails)] == ["EMAIL_ADDRESS"]
    allowed = pii.validate({"allow": ["jane@contoso.com"]})
    assert [f.entity for f in pii.check(text, allowed)] == ["PERSON"]
    strict = pii.validate({"threshold": 0.9})  # spaCy's names score 0.85
    assert [f.entity for f in pii.check(text, strict)] == ["EMAIL_ADDRESS"]


def test_a_custom_pattern_finds_its_entity_with_its_score(pii):
    settings = pii.validate(
        {"entities": [], "patterns": [{"name": "EMPLOYEE_ID", "regex": r"\bEMP-\d{6}\b"}]}
    )
    text = "Leave balance for EMP-009321 and EMP-118274, not EMP-12."
    findings = pii.check(text, settings)
    assert [(f.entity, text[f.start : f.end], f.score) for f in findings] == [
        ("EMPLOYEE_ID", "EMP-009321", 0.8),
        ("EMPLOYEE_ID", "EMP-118274", 0.8),
    ]


def test_a_pattern_that_backtracks_on_the_text_fails_the_check_instead_of_hanging(pii):
    """Validation probes a pattern with hostile inputs, but a pattern can still explode on a
    text of its own shape: the check then raises (the guardrail failed: 503 or fail-open),
    it does not hold the worker."""
    settings = {"entities": [], "patterns": [{"name": "SLOW", "regex": r"^(x+x+)+y$", "score": 1}]}
    with pytest.raises(PatternTimeout, match="SLOW"):
        pii.check("x" * 5000, settings)


def test_analysis_does_not_touch_the_network(pii, monkeypatch):
    """An e-mail address makes Presidio consult the public suffix list; it must come from the
    snapshot in the wheel, not from the internet."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access during a PII check")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    text = "Mail a.b@example.co.uk and c@sub.example.com.au"
    assert [f.entity for f in pii.check(text, pii.validate({}))] == ["EMAIL_ADDRESS"] * 2


def test_the_supported_entities_are_the_analyzers(pii):
    assert sorted(SUPPORTED_ENTITIES) == sorted(pii.analyzer.get_supported_entities("en"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"entities": ["SOCIAL_SECURITY"]}, "entities"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": "high"}, "threshold"),
        ({"language": "de"}, "language"),
        ({"patterns": {"name": "X"}}, "patterns"),
        ({"patterns": [{"name": "employee id", "regex": "E\\d+"}]}, "name"),
        ({"patterns": [{"name": "PERSON", "regex": "E\\d+"}]}, "already taken"),
        ({"patterns": [{"name": "EMP", "regex": "E\\d+", "colour": 1}]}, "name, regex, score"),
        ({"patterns": [{"name": "EMP", "regex": "(unclosed"}]}, "does not compile"),
        ({"patterns": [{"name": "EMP", "regex": "E" * 501}]}, "longer than 500"),
        ({"patterns": [{"name": "EMP", "regex": "(a+)+$"}]}, "catastrophic"),
        ({"patterns": [{"name": "EMP", "regex": "x*"}]}, "empty string"),
        ({"patterns": [{"name": "EMP", "regex": "E\\d+", "score": 3}]}, "score"),
        ({"patterns": [{"name": f"P{i}", "regex": "x"} for i in range(21)]}, "at most 20"),
        ({"entities": ["PERSON"], "treshold": 0.5}, "treshold"),
    ],
)
def test_bad_settings_name_the_field(settings, message):
    with pytest.raises(SettingsError, match=message):
        PiiDetector().validate(settings)


def test_defaults_are_filled_in():
    assert PiiDetector().validate({}) == {
        "entities": list(DEFAULT_ENTITIES),
        "threshold": 0.4,
        "patterns": [],
        "allow": [],
        "language": "en",
    }


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Please send the report to Sigrún Þórsdóttir by Friday.", "Sigrún Þórsdóttir"),
        ("Ole-Gunnar Sørensen wants a copy of the statement.", "Ole-Gunnar Sørensen"),
        ("Signed, Eero Järvinen", "Eero Järvinen"),
        ("Åsa Lindqvist joined the team.", "Åsa Lindqvist"),
    ],
)
def test_nordic_names_the_english_model_misses_are_people(pii, text, name):
    """spaCy's small English model calls many Nordic names an organisation or nothing; a first
    name before a Nordic surname ending is a PERSON with the name's span."""
    findings = pii.check(text, pii.validate({}))
    assert [(f.entity, text[f.start : f.end]) for f in findings] == [("PERSON", name)]


@pytest.mark.parametrize(
    ("text", "email"),
    [
        ("<!-- maintainer: ops@payments.corp -->", "ops@payments.corp"),
        ("<!-- owner: anna@bank.internal -->", "anna@bank.internal"),
        ("<!-- jane&#64;acme.com -->", "jane&#64;acme.com"),
        ("write to jane [at] acme [dot] com", "jane [at] acme [dot] com"),
    ],
)
def test_internal_and_spelled_out_email_addresses_are_found(pii, text, email):
    """Presidio's recogniser rejects domains outside the public suffix list (.corp, .internal)
    and an @ written as an entity or in words; those addresses are still e-mail addresses."""
    findings = pii.check(text, pii.validate({}))
    assert [(f.entity, text[f.start : f.end]) for f in findings] == [("EMAIL_ADDRESS", email)]


@pytest.fixture(scope="module")
def reference() -> PiiDetector:
    """The check over spaCy's whole pipeline, as it ran before issue 26."""
    detector = PiiDetector(reference=True)
    detector.load()
    return detector


@pytest.fixture(scope="module")
def tuning_texts() -> list[str]:
    return [prompt["text"] for prompt in load_prompts()]


@pytest.fixture(scope="module", params=["evaluation", "defaults"])
def selection(request, pii) -> dict:
    raw = (
        json.loads(SETTINGS.read_text(encoding="utf-8"))["pii"]
        if request.param == "evaluation"
        else {}
    )
    return pii.validate(raw)


def test_the_lean_pipeline_finds_what_the_whole_one_finds_on_the_tuning_set(
    pii, reference, tuning_texts, selection
):
    """GIVEN the tuning set's prompts
    WHEN the shipped check (spaCy without its parser) and the reference (the whole pipeline)
    read them
    THEN every prompt gets the same findings, spans and scores: only unused work was left out."""
    assert set(UNUSED_COMPONENTS).isdisjoint(pii.analyzer.nlp_engine.nlp["en"].pipe_names)
    differ = [
        text
        for text in tuning_texts
        if pii.check(text, selection) != reference.check(text, selection)
    ]
    assert differ == []


def test_check_many_answers_each_text_as_check_does(pii, tuning_texts, selection):
    """The service's batches read texts through spaCy together; each text's findings are
    still exactly its own ``check``'s."""
    assert pii.check_many(tuning_texts, selection) == [
        pii.check(text, selection) for text in tuning_texts
    ]


def test_check_many_with_only_custom_patterns_skips_spacy(pii):
    settings = pii.validate(
        {"entities": [], "patterns": [{"name": "EMPLOYEE_ID", "regex": r"\bEMP-\d{6}\b"}]}
    )
    texts = ["EMP-009321 asked Tom Becker.", "", "nothing here"]
    assert pii.check_many(texts, settings) == [pii.check(text, settings) for text in texts]
    assert [len(found) for found in pii.check_many(texts, settings)] == [1, 0, 0]


def test_check_many_cuts_long_texts_into_small_batches_in_order(pii):
    """Texts past the batch's character budget go to spaCy in later batches; each answer
    stays with its text."""
    long = "Call Tom Becker on 415-555-0175. " + "Nothing personal here. " * 800
    texts = [long, "Mail jane@contoso.com.", long, "Ask Priya Raman."]
    settings = pii.validate({})
    assert pii.check_many(texts, settings) == [pii.check(text, settings) for text in texts]
