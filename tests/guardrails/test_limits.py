"""The content limits: prompt length in tokens, allowed languages, banned substrings."""

from __future__ import annotations

import pytest

from guardrails.base import SettingsError
from guardrails.detectors.limits import (
    LANGUAGES,
    MAX_TOKENS,
    BannedSubstringsDetector,
    LanguageDetector,
    MaxPromptTokensDetector,
    words_only,
)
from guardrails.engine import redact


@pytest.fixture(scope="module")
def tokens(engine) -> MaxPromptTokensDetector:
    detector = engine.detector("max_prompt_tokens")
    assert isinstance(detector, MaxPromptTokensDetector)
    return detector


@pytest.fixture(scope="module")
def language(engine) -> LanguageDetector:
    detector = engine.detector("language")
    assert isinstance(detector, LanguageDetector)
    return detector


BANNED = BannedSubstringsDetector()


def test_tokens_are_counted_with_cl100k_from_the_wheel(tokens):
    """The reference count of tiktoken's cl100k_base for a known sentence (and a special token
    typed by a user is counted as text, not refused)."""
    assert tokens.count("hello world") == 2
    assert tokens.count("tiktoken is great!") == 6
    assert tokens.count("<|endoftext|>") > 1


def test_a_prompt_over_the_limit_is_a_finding_and_one_at_the_limit_is_not(tokens):
    text = "word " * 50  # one token per "word " in cl100k
    exact = tokens.count(text)
    assert tokens.check(text, tokens.validate({"max_tokens": exact})) == []
    [finding] = tokens.check(text, tokens.validate({"max_tokens": exact - 1}))
    assert finding.entity == "max_tokens"
    assert finding.start is None  # nothing to redact: the whole prompt is too long


def test_multibyte_text_is_counted_not_assumed_short(tokens):
    """Ten CJK characters are more than ten tokens' worth of bytes: the byte shortcut must not
    let them through a limit of 10."""
    text = "你好世界银行账户余额查询"
    assert tokens.count(text) > 10
    assert tokens.check(text, {"max_tokens": 10})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Bonjour, pouvez-vous m'aider à comprendre les frais sur mon relevé ?", "fr"),
        ("Guten Tag, ich möchte mein Konto kündigen und das Guthaben überweisen.", "de"),
        ("你好，我想查询一下我的信用卡账单和最近的交易记录。", "zh"),
    ],
)
def test_text_outside_the_allowed_languages_is_named_by_language(language, text, code):
    [finding] = language.check(text, language.validate({"allowed": ["en"]}))
    assert finding.entity == f"language:{code}"
    assert 0.8 <= finding.score <= 1.0


@pytest.mark.parametrize(
    "text",
    [
        "Why does boto3 fail with my key AKIAZ3MSJV4WWNKWW5QX? The region is eu-west-1.",
        "Schedule the meeting with the new analyst for Monday morning, please.",
        "OK",  # too short to judge
        "def transfer(amount): return ledger.post(amount)",
    ],
)
def test_english_with_identifiers_and_short_answers_pass(language, text):
    assert language.check(text, language.validate({"allowed": ["en"]})) == []


@pytest.mark.parametrize(
    "text",
    [
        "Schedule the meeting with Jürgen Müller and François Lefèvre for Monday.",
        "Our quarterly revenue grew 12.5% to 4,111,250 dollars.",
    ],
)
def test_english_that_the_identifier_misreads_is_kept_by_its_function_words(language, text):
    """GIVEN English whose names or figures make langid read another language (it says de/la
    and it) WHEN checked with English allowed THEN its English function words overrule that."""
    assert language._identifier.classify(words_only(text))[0] != "en"
    assert language.check(text, language.validate({"allowed": ["en"]})) == []


def test_an_allowed_second_language_passes(language):
    settings = language.validate({"allowed": ["en", "FR"]})
    assert settings["allowed"] == ["en", "fr"]
    assert language.check("Bonjour, pouvez-vous m'aider avec ma facture ce matin ?", settings) == []


def test_the_language_list_is_the_identifiers():
    from langid.langid import LanguageIdentifier, model  # type: ignore[import-untyped]

    identifier = LanguageIdentifier.from_modelstring(model)
    assert sorted(LANGUAGES) == sorted(identifier.nb_classes)


def test_banned_substrings_are_found_case_insensitively_with_spans():
    settings = BANNED.validate({"substrings": ["Project Falcon", "insider trading"]})
    text = "Status of PROJECT falcon? And the insider trading memo."
    findings = BANNED.check(text, settings)
    assert [text[f.start : f.end] for f in findings] == ["PROJECT falcon", "insider trading"]
    assert {f.entity for f in findings} == {"banned_substring"}
    assert (
        redact(text, findings) == "Status of <banned_substring>? And the <banned_substring> memo."
    )


def test_whole_words_and_case_sensitivity_narrow_the_match():
    text = "The falconry club met Falcon."
    loose = BANNED.validate({"substrings": ["falcon"]})
    assert len(BANNED.check(text, loose)) == 2
    whole = BANNED.validate({"substrings": ["falcon"], "whole_words": True})
    assert [text[f.start : f.end] for f in BANNED.check(text, whole)] == ["Falcon"]
    exact = BANNED.validate({"substrings": ["falcon"], "case_sensitive": True})
    assert [text[f.start : f.end] for f in BANNED.check(text, exact)] == ["falcon"]


def test_substrings_are_literal_not_patterns():
    settings = BANNED.validate({"substrings": ["a.b (c)"]})
    assert BANNED.check("axb c", settings) == []
    assert len(BANNED.check("see a.b (c) here", settings)) == 1


@pytest.mark.parametrize(
    ("detector", "settings", "field"),
    [
        (MaxPromptTokensDetector(), {"max_tokens": 0}, "max_tokens"),
        (MaxPromptTokensDetector(), {"max_tokens": "100"}, "max_tokens"),
        (MaxPromptTokensDetector(), {"max_tokens": True}, "max_tokens"),
        (LanguageDetector(), {"allowed": ["english"]}, "allowed"),
        (LanguageDetector(), {"allowed": []}, "allowed"),
        (LanguageDetector(), {"min_confidence": 2}, "min_confidence"),
        (LanguageDetector(), {"min_chars": -1}, "min_chars"),
        (BannedSubstringsDetector(), {}, "substrings"),
        (BannedSubstringsDetector(), {"substrings": ["ok", " "]}, "substrings"),
        (BannedSubstringsDetector(), {"substrings": ["x" * 201]}, "substrings"),
        (BannedSubstringsDetector(), {"substrings": ["x"], "whole_words": "yes"}, "whole_words"),
        (BannedSubstringsDetector(), {"substrings": ["x"], "casesensitive": True}, "casesensitive"),
    ],
)
def test_bad_settings_name_the_field(detector, settings, field):
    with pytest.raises(SettingsError, match=field):
        detector.validate(settings)


def test_defaults_are_filled_in():
    assert MaxPromptTokensDetector().validate({}) == {"max_tokens": 8192}
    assert LanguageDetector().validate({}) == {
        "allowed": ["en"],
        "min_chars": 20,
        "min_confidence": 0.8,
    }
    assert BannedSubstringsDetector().validate({"substrings": ["x", "x"]}) == {
        "substrings": ["x"],
        "case_sensitive": False,
        "whole_words": False,
    }


def test_the_prompt_limit_counts_every_message_of_a_request_together(engine):
    """GIVEN a 20-token prompt limit WHEN a chat splits 60 words over six short messages
    (each under the limit) THEN the request is blocked: the limit is on the prompt."""
    from guardrails.engine import Check

    messages = [" ".join(["word"] * 10)] * 6
    check = Check("max_prompt_tokens", "block", {"max_tokens": 20})

    outcome = engine.run(messages, [check])

    assert outcome.blocked is not None
    assert outcome.blocked.guardrail == "max_prompt_tokens"
    assert outcome.blocked.entities == {MAX_TOKENS: 1}
    assert engine.run(messages[:1], [check]).blocked is None
