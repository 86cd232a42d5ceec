"""The rule layer beside the prompt-injection classifier.

The classifier reads meaning but is easily moved by surface: it misses persona jailbreaks
written as a story, instructions spelled with digits for letters ("1gn0r3"), requests to print
"the text above", and someone posing as an administrator to approve an action; and it fires on
ordinary office uses of "ignore … previous" ("please ignore my previous e-mail"). The rules
here name those shapes. ``screen`` finds an attack by its shape, on the text and on the text
with look-alike spelling undone, and otherwise says whether the classifier's reading of the
text would mean anything (not for an office "ignore my previous message").
"""

from __future__ import annotations

import regex

#: digits and symbols written for letters ("1gn0r3 4ll pr3v10us")
_LEET = str.maketrans(
    {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "@": "a", "$": "s",
     "!": "i", "|": "l", "€": "e"}
)  # fmt: skip
#: letters spaced or dotted out ("i g n o r e", "i.g.n.o.r.e")
_SPACED = regex.compile(r"\b(?:\w[ ._\-*]){3,}\w\b")
_INVISIBLE = regex.compile(r"[\p{Cf}\u034f]")

_OVERRIDE = (
    r"\b(?:ignore|disregard|forget|bypass|override|skip|drop|abandon|set aside|pay no attention to)"
    r"\b[^.!?\n]{0,40}?\b(?:previous|prior|above|earlier|preceding|all|any|your|the system|initial"
    r"|original|former|existing|those|these|safety)\b[^.!?\n]{0,30}?\b(?:instructions?|prompts?"
    r"|rules|directions|guidelines|directives|constraints|polic(?:y|ies)|programming|guardrails"
    r"|restrictions|filters|training|commands|orders)\b"
)
_LEAK = (
    r"\b(?:print|repeat|reveal|show|output|display|tell me|give me|write out|write down|dump|copy"
    r"|echo|recite|list|spell out|paste|return|share|disclose|expose|leak"
    r"|read back)\b[^.!?\n]{0,40}?"
    r"(?:\b(?:text|words|content|everything|instructions?|messages?|prompts?|lines|sentences)"
    r"\s+(?:above|before (?:this|that|my)|preceding|prior to|so far|you were given|at the (?:start|"
    r"beginning|top))"
    r"|\b(?:system|initial|hidden|original|secret|developer|pre-?prompt|first)\s+(?:prompt|"
    r"instructions?|message|rules|configuration|directives))"
    r"|\bwhat (?:was|were|is|are) (?:your|the) (?:system |initial |original |first |hidden )"
    r"?(?:prompt|instructions)\b"
    r"|\b(?:start|begin) your (?:reply|answer|response) with\b[^.!?\n]{0,20}\byou are\b"
)
_PERSONA = (
    r"\b(?:you are|you're|you will be|act as|acting as|pretend(?: to be| you are| that you are)?"
    r"|role-?play(?: as)?|play the (?:role|part) of|from now on,? you|imagine you are|you have"
    r" become|become|simulate|behave like)\b[^\n]{0,80}?\b(?:DAN|jailbr(?:oken|eak)|unfiltered"
    r"|uncensored|unrestricted|unbound|unlimited|no (?:restrictions|rules|limits|limitations|"
    r"filters|guidelines|ethics|morals|boundaries|content polic(?:y|ies))|without (?:any )?"
    r"(?:restrictions|rules|limits|limitations|filters|guidelines|ethics|morals|censorship|"
    r"boundaries)|evil|amoral|immoral|developer mode|god mode|do anything now|not bound by"
    r"|free (?:from|of) (?:all |any )?(?:rules|restrictions|guidelines|polic)|(?:does|do|will)"
    r" ?n[o']t (?:have to )?(?:follow|obey|care about|abide)|never refuses?|cannot refuse"
    r"|can'?t refuse|answers? (?:any|every)thing|opposite of)\b"
    r"|\b(?:stay|remain|keep) in character\b|\bdo anything now\b"
    r"|\b(?:escaped|broken (?:out of|free (?:of|from))|freed from|no longer bound by) (?:its|the"
    r"|your|their"
    r"|all|any)? ?(?:sandbox|constraints|programming|restrictions|rules|guidelines|chains)\b"
    r"|\b(?-i:DAN|STAN|DUDE|AIM)\b[^\n]{0,40}\b(?:mode|prompt|persona|stands for|which stands)"
    r"|\bjailbr(?:eak|oken)\b"
)
_AUTHORITY = (
    r"(?:\b(?:as|i am|i'm|this is|speaking as|message from|note from|on behalf of)\s+(?:the |your"
    r" |an |a )?(?:system |chief |head |lead |senior |it |platform )?(?:administrator|admin|"
    r"developer|operator|owner|sysadmin|root user|security team|it department|compliance officer"
    r"|openai|anthropic|model provider)\b[^\n]{0,100}?\b(?:approve|authori[sz]e|override|grant"
    r"|unlock|disable|enable|bypass|allow|confirm|execute|reset|elevate|whitelist|skip|waive)"
    r"|\b(?:admin|administrator|developer|system|root|sudo|maintenance|debug)\s+(?:override|"
    r"mode|access|command|authori[sz]ation|privileges?)\s+(?:enabled|activated|granted|on|:)"
    r"|\[(?:system|admin|administrator|developer|root)(?: message| override| note)?\]"
    r"|<\|?(?:system|im_start|im_end|endoftext)\|?>|#{2,}\s*(?:system|new instructions?)\b"
    r"|\b(?:new|updated|real|actual|true|revised) (?:instructions?|task|rules|directives?|system"
    r" prompt)\s*[:：])"
)

#: "never refuse", "no warnings or disclaimers": refusal suppression, asked of the model
_NO_REFUSAL = (
    r"\b(?:never|don'?t|do not|you (?:can|may|must) ?not|must never|will never) (?:ever )?(?:refuse"
    r"|decline|say (?:no|you can'?t|that you can'?t|you cannot|sorry)|apologi[sz]e)\b"
    r"|\b(?:do not|don'?t|never|without) (?:include|add|give|adding|including|giving"
    r"|any) ?(?:any )?"
    r"(?:warnings?|disclaimers?|caveats?|moral(?:ising|izing)?|lectures?|ethical (?:notes"
    r"|concerns))"
)
#: the override in the languages the guardrails' users write
_OVERRIDE_ELSEWHERE = (
    r"\b(?:ignorier(?:e|en)?|vergiss|vergessen sie|missachte|ignore[zr]?|oublie[zr]?|ignora(?:te)?"
    r"|olvida|dimentica|esque[çc]a|negeer|vergeet|ignorera|gl[öo]m|glem|ignorer|unohda)\b"
    r"[^.!?\n]{0,40}?\b(?:Anweisungen|Instruktionen|Regeln|Vorgaben|consignes|r[èe]gles"
    r"|instrucciones"
    r"|reglas|istruzioni|regole|instru[çc][õo]es|regras|instructies|regels|instruktioner|regler"
    r"|instrukser|instruksjoner|ohjeet|s[äa][äa]nn[öo]t)\b"
)

_ATTACKS: tuple[tuple[str, regex.Pattern[str]], ...] = tuple(
    (name, regex.compile(pattern, regex.IGNORECASE))
    for name, pattern in (
        ("override", _OVERRIDE),
        ("prompt_leak", _LEAK),
        ("persona", _PERSONA),
        ("authority", _AUTHORITY),
        ("no_refusal", _NO_REFUSAL),
        ("override", _OVERRIDE_ELSEWHERE),
    )
)

#: an office "ignore": my previous e-mail, the last invoice, that earlier draft
_BENIGN_IGNORE = regex.compile(
    r"\b(?:please |kindly |you can |feel free to )?(?:ignore|disregard)\s+(?:my|the|this|that|our|"
    r"his|her|their|any)\s+(?:previous|last|earlier|prior|former|preceding|first|old|other|"
    r"duplicate|above)\s+(?:\w+\s+)?(?:e-?mails?|mails?|messages?|reply|replies|responses?"
    r"|comments?|answers?"
    r"|questions?|requests?|invoices?|orders?|versions?|attempts?|drafts?|notes?|calls?|reminders?"
    r"|letters?|statements?|forms?|files?|attachments?|submissions?|quotes?|estimates?|tickets?"
    r"|payments?|notifications?|alerts?|meeting invites?|invites?|posts?|link|links|numbers?"
    r"|figures?|reports?)\b",
    regex.IGNORECASE,
)


#: Unicode tag characters, which display as nothing and spell ASCII ("ASCII smuggling")
_TAGS = regex.compile(r"[\U000E0020-\U000E007E]{3,}")


def smuggled(text: str) -> str:
    """What a text spells in Unicode tag characters: text meant for the model, not the reader."""
    return " ".join(
        "".join(chr(ord(c) - 0xE0000) for c in run) for run in _TAGS.findall(text)
    ).strip()


def _readings(text: str) -> list[str]:
    """The text, and the text with look-alike spelling undone where that changes it."""
    plain = _INVISIBLE.sub("", text)
    readings = [plain]
    joined = _SPACED.sub(lambda m: regex.sub(r"[ ._\-*]", "", m.group()), plain)
    unleet = joined.translate(_LEET)
    for reading in (joined, unleet):
        if reading not in readings:
            readings.append(reading)
    return readings


def _attack(text: str, readings: list[str]) -> str | None:
    if regex.search(r"[A-Za-z]{2,}", smuggled(text)):
        return "smuggled"  # words hidden from the reader are instructions for the model
    for reading in readings:
        for name, pattern in _ATTACKS:
            if pattern.search(reading):
                return name
    return None


def attack(text: str) -> str | None:
    """The name of the first attack shape found, or None."""
    return _attack(text, _readings(text))


#: words by which a text addresses a model or its instructions. An injection has to: a text
#: with none of them (a config line, a greeting in Polish, an emoji) is outside what the
#: classifier was trained on, and its readings there are noise.
_ADDRESSES_THE_MODEL = regex.compile(
    r"\b(?:instruct\w*|prompts?|rules?|ignor\w*|disregard\w*|forget|pretend\w*|act(?:ing)? as"
    r"|role\w*|system|developer|admin\w*|reveal\w*|secret\w*|password\w*|bypass\w*|jailbr\w*"
    r"|filter\w*|restrict\w*|polic\w*|guideline\w*|you are|you're|you will|you must|obey\w*"
    r"|compl(?:y|ies|iance)|assistant|(?-i:AI)|model|chatgpt|gpt|llm|bot|respond\w*|answer\w*"
    r"|refus\w*|censor\w*|character|persona|mode|command\w*|execut\w*|override\w*|confidential"
    r"|hidden|previous|above|now on|from now|simulat\w*|imagine|hypothetical\w*|stor(?:y|ies)"
    r"|game|unlock\w*|tell me|say|print|output|repeat|translat\w*|decode|base64|encod\w*)\b",
    regex.IGNORECASE,
)


def screen(text: str) -> tuple[str | None, bool]:
    """The rules' verdict on a text, its readings made once: the attack shape found (or None),
    and whether the classifier should read it — only a text that addresses a model or its
    instructions (``_ADDRESSES_THE_MODEL``) outside an office "ignore my previous e-mail"
    (``_BENIGN_IGNORE``). The office phrase excuses its own words only: a text that holds it
    and addresses the model elsewhere is still read, or the phrase would be a way past the
    classifier."""
    readings = _readings(text)
    shape = _attack(text, readings)
    if shape is not None:
        return shape, False
    return None, any(
        _ADDRESSES_THE_MODEL.search(_BENIGN_IGNORE.sub(" ", reading)) for reading in readings
    )


def addresses_the_model(text: str) -> bool:
    """Whether any spelling of ``text`` has a word by which it addresses a model."""
    return any(_ADDRESSES_THE_MODEL.search(reading) for reading in _readings(text))
