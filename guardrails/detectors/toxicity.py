"""Toxicity and profanity: ``alt-profanity-check``'s linear model (shipped in its wheel).

The model is a bag-of-words classifier trained on short comments, so one insult inside a long,
polite answer barely moves a whole-text score. The text is scored sentence by sentence (lines
and sentence ends) and the worst sentence is the text's score.

A bag of words learns abuse from its vocabulary, so it misses harm said in plain words: telling
someone to kill themselves, a threat, or asking the model to write insults and humiliation for
someone. A rule layer (``_HARM``) covers those shapes; a match scores ``RULE_SCORE``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields

TOXICITY = "toxicity"
DEFAULT_THRESHOLD = 0.8
_SENTENCES = regex.compile(r"(?<=[.!?;])\s+|\n+")
#: sentences scored per text at most; a long answer is cut into this many groups
_MAX_PIECES = 256


#: the score of a rule match: above the default threshold, below a certain model reading
RULE_SCORE = 0.95
_YOU = r"(?:you|u|ya|yourself|urself|your ?self)"
_TARGET = r"(?:my|our|his|her|their|this|that|the|a|an|him|them|me|us|(?-i:[A-Z][a-z]+))"
#: harm without profanity, in the shapes people write it (English: the model's language)
_HARM = regex.compile(
    "|".join(
        (
            # incitement to self-harm
            rf"\b(?:kill|hang|hurt|cut|shoot|drown|off|end)\s+{_YOU}\b(?!\s+(?:out|off|up|from"
            rf"|in))",
            r"\bkys\b",
            r"\bend (?:it all|your (?:own )?life)\b",
            r"\b(?:go|just|please|should|better)\s+(?:\w+\s+)?(?:die|jump off (?:a|the) \w+)\b",
            r"\b(?:better off|happier|a better place) (?:without you|if you (?:were|was) (?:dead"
            r"|gone)"
            r"|if you (?:died|weren'?t (?:alive|here|around)))",
            r"\b(?:nobody|no one|no-one)(?: would| will)? (?:miss|mourn|care about) you\b",
            r"\byou (?:don'?t|do not|never) deserve to (?:live|exist|be alive|breathe)",
            r"\bdo (?:us|everyone|the world|yourself) a favou?r and (?:die|disappear|jump|end)",
            r"\b(?:drink|swallow) (?:bleach|poison)\b",
            # threats
            r"\bI(?:'ll| will|'m going to| am going to|'m gonna| gonna)\s+(?:kill|hurt|beat|stab"
            r"|shoot|strangle|choke|rape|burn)\s+(?:you|u|him|her|them|your)\b",
            r"\bI(?:'ll| will|'m going to| am going to|'m gonna| gonna)\s+(?:find|hunt|track)\s+"
            r"(?:you|u|him|her|them)\s+(?:down|and)\b",
            r"\bI know where (?:you|he|she|they) (?:live|work|sleep)s?\b",
            r"\byou(?:'ll| will)(?: soon)? (?:regret|pay for) (?:this|that|it)\b.{0,40}\b(?:hurt"
            r"|kill|die|blood)",
            # asking for abuse aimed at someone
            rf"\b(?:insult|humiliate|demean|belittle|bully|harass|ridicule|torment)\s+{_TARGET}\b",
            r"\b(?:write|compose|draft|give me|generate|come up with|make|create|list"
            r"|send)\b[^.?!\n]{0,50}"
            r"\b(?:insults?|put-?downs?|slurs?|death threats?|threatening (?:message|note|letter"
            r"|email)s?"
            r"|(?:hurtful|cruel|vicious|humiliating|degrading|demeaning|insulting|nasty|abusive"
            r"|hateful)"
            r" (?:things?|words?|message|messages|note|notes|comments?|names?|jokes?|letter|email"
            r"|text"
            r"|reply|review|post))\b",
            r"\b(?:most|really|extremely|truly|very) (?:hurtful|cruel|vicious|humiliating|degrading"
            r"|insulting|brutal) (?:things?|words?|way|insults?|names?|comments?|thing)\b",
            r"\bmake (?:him|her|them|my \w+) (?:cry|feel (?:worthless|useless|stupid|ugly|small"
            r"|like"
            r" (?:dirt|garbage|trash|nothing)))",
            r"\b(?:tell|remind|convince) (?:him|her|them|my \w+|\w+) (?:that )?(?:he|she|they)"
            r" (?:is|are|'s|'re) (?:worthless|useless|pathetic|a waste|ugly|disgusting|a failure)",
        )
    ),
    regex.IGNORECASE,
)


#: insults and profanity in the languages the platform's users write besides English (the
#: model knows English only), written for Switchyard: common strong terms whose spelling is no
#: English word ("con", "skit", "fan", "hora" and "kanker" are left out for that reason)
_INSULTS: dict[str, tuple[str, ...]] = {
    "de": ("arschloch", "arschlöcher", "wichser", "fotze", "hurensohn", "scheiße", "scheisse",
           "scheißkerl", "verpiss dich", "fick dich", "missgeburt", "schlampe", "miststück",
           "drecksau", "vollidiot", "trottel", "halt die fresse", "leck mich", "pisser",
           "schwuchtel", "dreckskerl", "wixer", "hure"),
    "fr": ("connard", "connasse", "salope", "putain", "enculé", "enfoiré", "ta gueule",
           "va te faire foutre", "nique ta mère", "fils de pute", "abruti", "pétasse",
           "trou du cul", "couillon", "pédé", "salaud", "merde", "conne", "grosse pute"),
    "es": ("gilipollas", "cabrón", "hijo de puta", "hija de puta", "mierda", "joder", "coño",
           "pendejo", "pendeja", "maricón", "zorra", "capullo", "jódete", "vete a la mierda",
           "malparido", "culero", "chinga tu madre", "subnormal", "imbécil", "puta", "puto"),
    "it": ("stronzo", "stronza", "vaffanculo", "cazzo", "coglione", "puttana", "troia",
           "figlio di puttana", "testa di cazzo", "frocio", "zoccola", "minchia", "fottiti",
           "cretino", "deficiente", "merda", "bastardo"),
    "pt": ("porra", "caralho", "foda-se", "filho da puta", "otário", "babaca", "cuzão",
           "vai tomar no cu", "desgraçado", "vagabunda", "arrombado", "cala a boca", "merda",
           "puta"),
    "nl": ("klootzak", "kutwijf", "godverdomme", "tering", "sukkel", "mongool", "flikker",
           "rot op", "debiel", "kankerlijer", "hoer", "eikel", "trut", "kut"),
    "sv": ("jävla", "jävel", "fitta", "kuksugare", "fittjävel", "dra åt helvete", "håll käften",
           "idiotjävel", "hora jävel", "satmara"),
    "da": ("kraftidiot", "kælling", "røvhul", "fisse", "pikhoved", "hold kæft", "luder",
           "fuck dig"),
    "no": ("drittsekk", "faen", "jævla", "fitte", "rasshøl", "hold kjeft", "hore"),
    "fi": ("vittu", "perkele", "saatana", "kusipää", "mulkku", "huora", "idiootti",
           "haista vittu", "runkkari", "paska"),
    "pl": ("kurwa", "chuj", "spierdalaj", "pierdolony", "pierdol", "jebać", "jebany",
           "skurwysyn", "cipa", "pizda", "zamknij mordę", "dupek", "kutas", "szmata", "ciota"),
}  # fmt: skip
_INSULT = regex.compile(
    r"(?<!\w)(?:"
    + "|".join(
        regex.escape(word)
        for word in sorted({w for words in _INSULTS.values() for w in words}, key=len, reverse=True)
    )
    + r")(?!\w)",
    regex.IGNORECASE | regex.V1 | regex.FULLCASE,
)


class ToxicityDetector:
    """Insults, profanity, abuse, incitement to self-harm, threats, and requests for abuse;
    score = the model's probability for the worst sentence, or the rule score on a match."""

    name: ClassVar[str] = "toxicity"

    def __init__(self) -> None:
        self._predict: Callable[[Sequence[str]], Any] | None = None

    def load(self) -> None:
        with warnings.catch_warnings():
            # The wheel's model was pickled by an older scikit-learn; it loads and predicts
            # the same (tests/guardrails/test_toxicity.py holds its answers).
            warnings.simplefilter("ignore")
            from profanity_check import predict_prob  # type: ignore[import-untyped]

            predict_prob(["warm up"])
        self._predict = predict_prob

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("threshold",))
        return {"threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD)}

    def score(self, text: str) -> float:
        if self._predict is None:
            self.load()
        assert self._predict is not None
        pieces = [p for p in _SENTENCES.split(text) if p.strip()] or [text]
        if len(pieces) > _MAX_PIECES:
            size = -(-len(pieces) // _MAX_PIECES)
            pieces = [" ".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]
        model = float(max(self._predict(pieces)))
        harm = _HARM.search(text) is not None or _INSULT.search(text) is not None
        return max(model, RULE_SCORE) if harm else model

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        score = self.score(text)
        if score < float(settings.get("threshold", DEFAULT_THRESHOLD)):
            return []
        return [Finding(TOXICITY, round(score, 4))]
