"""What a registered file may be called: a name, never a path (issue 24, defect 14).

A registration's filename becomes the last segment of its object keys
(``uploads/<tenant>/<use case>/<id>/<filename>``, and ``<id>/<filename>`` in the use case's
virtual bucket): a ``/``, ``\\`` or ``..`` would reach another registration's (or tenant's)
folder, and a control or format character would break logs, headers and what a person reads
(a right-to-left override makes ``gpj.exe`` look like ``exe.jpg``). Registration refuses such
names (``filename_problem``); keys are built through ``object_segment``, which keeps a good
name as it is and folds a bad one (rows stored before the rule) into one safe segment.

Pure: no Django, so the S3 endpoint and the scheduler's key builders can use it too.
"""

from __future__ import annotations

import unicodedata

# A file system's NAME_MAX, in UTF-8 bytes: with the folder prefix an object key stays well
# under S3's 1,024-byte limit, and the FileRegistration.filename column (255 characters) holds it.
MAX_FILENAME_BYTES = 255


def _unprintable(char: str) -> bool:
    # Cc (C0, DEL, C1), Cf (bidi overrides, zero-width), Cs, Co, Cn; and line/paragraph breaks.
    return unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp")


def filename_problem(filename: str) -> str | None:
    """Why ``filename`` cannot name a registered file, or None when it can."""
    if not filename:
        return "A file name is required."
    if len(filename.encode()) > MAX_FILENAME_BYTES:
        return f"A file name is at most {MAX_FILENAME_BYTES} bytes (UTF-8)."
    if "/" in filename or "\\" in filename:
        return "A file name, not a path: no '/' or '\\'."
    if ".." in filename:
        return "A file name may not contain '..'."
    if not filename.strip("."):
        return "A file name cannot be made of dots only."
    if any(_unprintable(char) for char in filename):
        return "A file name may not hold control or invisible formatting characters."
    return None


def object_segment(filename: str) -> str:
    """``filename`` as one object-key segment: itself when ``filename_problem`` takes it,
    else with separators and unprintable characters as ``_``, dot runs cut, and bounded."""
    if filename_problem(filename) is None:
        return filename
    cleaned = "".join("_" if c in "/\\" or _unprintable(c) else c for c in filename)
    while ".." in cleaned:
        cleaned = cleaned.replace("..", "_.")
    cleaned = cleaned.encode()[:MAX_FILENAME_BYTES].decode(errors="ignore")
    return cleaned if cleaned.strip(".") else f"_{cleaned}"[:MAX_FILENAME_BYTES]
