"""Documents (kinds ``pdf`` and ``text``): extract, chunk, embed, and one LLM pass per part.

``plan`` extracts the text — pypdf, page by page, for a PDF (one with no text layer at all
fails: there is nothing to read without OCR; pypdf's work is bounded, see ``_PDF_LIMITS``);
UTF-8 for a text file (a NUL byte or invalid UTF-8 means binary and fails), cut into
``TEXT_PAGE_CHARS`` "pages" at line ends — and groups ``PAGES_PER_PART`` pages into a part,
written to ``out/parts/<n>.pages.json``.

``run_part``:
* chunks each page (``CHUNK_CHARS`` characters with ``CHUNK_OVERLAP`` of overlap, cut at
  whitespace where it can);
* embeds the chunks through ``/v1/embeddings`` with the first model the use case may call that
  has the ``embeddings`` capability; a use case with none gets chunks without embeddings
  (``embedding: null``) rather than a failure — the text and summary are still useful;
* summarises the part's text through ``/v1/chat/completions`` (``/v1/completions`` for a
  model without chat) on the registration's model, with ``metadata["prompt"]`` of the
  registration as the instruction, or a default one.

``finish`` writes ``text.txt`` (the PDF's pages, a blank line between them; the text file as
it was), ``chunks.jsonl`` (text, page, embedding) and
``summary.json``: the per-part summaries and their concatenation in page order. The runner's
``finish`` has no gateway, on purpose (it must be cheap and repeatable), so the summaries are
concatenated rather than summarised once more; a team that wants one paragraph asks for a
shorter per-part summary in its prompt.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pypdf import Configuration, PdfReader, apply_configuration
from pypdf.errors import LimitReachedError, PdfReadError

from scheduler.files.pipelines.base import (
    GatewayCaller,
    JobContext,
    ObjectStore,
    PartFailed,
    PartResult,
    register,
)

PAGES_PER_PART = 5
TEXT_PAGE_CHARS = 4000
CHUNK_CHARS = 1000
CHUNK_OVERLAP = 200
SUMMARY_INPUT_CHARS = 12_000  # what one LLM pass reads of a part
SUMMARY_MAX_TOKENS = 400
DEFAULT_PROMPT = (
    "Summarise the following document excerpt in a few sentences: its subject, the key facts "
    "and figures, and any obligations or dates."
)


# pypdf's work on one file is bounded, so a small file cannot make a worker inflate gigabytes
# or extract for hours (a PDF bomb): every stream inflates to at most MAX_STREAM_BYTES (a
# page's text is far less), the pages are at most what was declared plus a margin (MAX_PAGES
# when nothing was), and extraction gives up after EXTRACT_SECONDS.
MAX_STREAM_BYTES = 16 * 1024 * 1024
MAX_PAGES = 2000
PAGES_MARGIN_RATIO = 0.1
PAGES_MARGIN = 5
EXTRACT_SECONDS = 300.0
_PDF_LIMITS = Configuration().with_overwrites(
    **{
        name: MAX_STREAM_BYTES
        for name in (
            "zlib_maximum_output_length",
            "lzw_maximum_output_length",
            "run_length_maximum_output_length",
            "brotli_maximum_output_length",
            "jbig2_maximum_output_length",
            "array_based_stream_maximum_output_length",
            "image_maximum_buffer_size",
        )
    },
    stream_decoding_work_maximum_length=4 * MAX_STREAM_BYTES,
)


def page_bound(registered_pages: int | None) -> int:
    """The most pages a PDF registered with ``registered_pages`` may hold."""
    if registered_pages is None:
        return MAX_PAGES
    return min(MAX_PAGES, math.ceil(registered_pages * (1 + PAGES_MARGIN_RATIO)) + PAGES_MARGIN)


def pdf_pages(content: bytes, *, registered_pages: int | None = None) -> list[str]:
    bound = page_bound(registered_pages)
    try:
        with apply_configuration(_PDF_LIMITS):
            reader = PdfReader(io.BytesIO(content))
            count = len(reader.pages)
            if count > bound:
                said = (
                    f"{registered_pages} registered, plus a margin"
                    if registered_pages
                    else "the most a file job reads"
                )
                raise PartFailed(
                    f"The PDF has {count} pages, more than the {bound} it may have ({said})."
                )
            deadline = time.monotonic() + EXTRACT_SECONDS
            pages = []
            for page in reader.pages:
                if time.monotonic() > deadline:
                    raise PartFailed(
                        f"The PDF's text took more than {EXTRACT_SECONDS:.0f} s to extract."
                    )
                pages.append(page.extract_text() or "")
    except LimitReachedError as exc:
        raise PartFailed(
            "The PDF is too large to read safely: a stream in it inflates past "
            f"{MAX_STREAM_BYTES // (1024 * 1024)} MiB."
        ) from exc
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise PartFailed(f"The PDF could not be read ({type(exc).__name__}).") from exc
    if not any(page.strip() for page in pages):
        raise PartFailed("The PDF has no text layer (a scan?): there is no text to process.")
    return pages


def text_pages(content: bytes) -> list[str]:
    if b"\x00" in content:
        raise PartFailed("The text file is binary (it holds NUL bytes), not UTF-8 text.")
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PartFailed(f"The text file is not UTF-8 (byte {exc.start} is invalid).") from exc
    if not text.strip():
        raise PartFailed("The text file is empty.")
    pages: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > TEXT_PAGE_CHARS and current:
            pages.append("".join(current))
            current, size = [], 0
        while len(line) > TEXT_PAGE_CHARS:  # one enormous line
            pages.append(line[:TEXT_PAGE_CHARS])
            line = line[TEXT_PAGE_CHARS:]
        current.append(line)
        size += len(line)
    if current:
        pages.append("".join(current))
    return pages


def chunks(text: str, size: int = CHUNK_CHARS, overlap: int = CHUNK_OVERLAP) -> list[str]:
    """Pieces of at most ``size`` characters, each starting ``overlap`` before the last one
    ended, cut at whitespace when there is some in the second half of the piece."""
    text = text.strip()
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + size // 2, end)
            if space > start:
                end = space
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        if end >= len(text):
            break
        start = max(start + 1, end - overlap)
    return pieces


def _answer_text(answer: Mapping[str, Any]) -> str:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PartFailed("The model answered without choices.")
    first = choices[0]
    message = first.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return str(message["content"]).strip()
    if isinstance(first.get("text"), str):
        return str(first["text"]).strip()
    raise PartFailed("The model answered without text.")


def _tokens(answer: Mapping[str, Any]) -> int:
    usage = answer.get("usage")
    return int(usage.get("total_tokens") or 0) if isinstance(usage, dict) else 0


class DocumentPipeline:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def plan(self, job: JobContext, store: ObjectStore) -> list[dict[str, Any]]:
        content = store.read(job.source_object)
        if self.kind == "pdf":
            pages = pdf_pages(content, registered_pages=job.pages)
        else:
            pages = text_pages(content)
        specs = []
        for index, first in enumerate(range(0, len(pages), PAGES_PER_PART)):
            group = pages[first : first + PAGES_PER_PART]
            name = f"{job.output_prefix}parts/{index:05d}.pages.json"
            store.write(
                name,
                orjson.dumps([{"page": first + i + 1, "text": t} for i, t in enumerate(group)]),
                "application/json",
            )
            specs.append({"pages": [first + 1, first + len(group)], "source": name})
        return specs

    def run_part(
        self,
        job: JobContext,
        spec: Mapping[str, Any],
        index: int,
        gateway: GatewayCaller,
        store: ObjectStore,
    ) -> PartResult:
        pages = orjson.loads(store.read(str(spec["source"])))
        rows = [
            {"text": piece, "page": page["page"], "embedding": None}
            for page in pages
            for piece in chunks(page["text"])
        ]
        tokens = 0
        model = str(job.settings.get("embedding_model") or "")
        if model and rows:
            answer = gateway.post_json(
                "/v1/embeddings", {"model": model, "input": [row["text"] for row in rows]}
            )
            data = answer.get("data")
            if not isinstance(data, list) or len(data) != len(rows):
                raise PartFailed("The embedding model answered with the wrong number of vectors.")
            for row, item in zip(rows, sorted(data, key=lambda d: d.get("index", 0)), strict=True):
                row["embedding"] = item.get("embedding")
            tokens += _tokens(answer)
        text = "\n\n".join(page["text"] for page in pages).strip()
        summary = ""
        if text:
            prompt = str(job.settings.get("prompt") or DEFAULT_PROMPT)
            excerpt = text[:SUMMARY_INPUT_CHARS]
            if "chat" in job.settings.get("capabilities", ["chat"]):
                answer = gateway.post_json(
                    "/v1/chat/completions",
                    {
                        "model": job.model,
                        "messages": [
                            {"role": "system", "content": prompt},
                            {"role": "user", "content": excerpt},
                        ],
                        "max_tokens": SUMMARY_MAX_TOKENS,
                    },
                )
            else:
                answer = gateway.post_json(
                    "/v1/completions",
                    {
                        "model": job.model,
                        "prompt": f"{prompt}\n\n{excerpt}\n\nSummary:",
                        "max_tokens": SUMMARY_MAX_TOKENS,
                    },
                )
            summary = _answer_text(answer)
            tokens += _tokens(answer)
        name = f"{job.output_prefix}parts/{index:05d}.json"
        store.write(
            name,
            orjson.dumps(
                {"pages": spec["pages"], "texts": pages, "chunks": rows, "summary": summary}
            ),
            "application/json",
        )
        return PartResult(
            output_object=name, tokens=tokens, counts={"pages": len(pages), "chunks": len(rows)}
        )

    def finish(
        self, job: JobContext, parts: Sequence[PartResult], store: ObjectStore
    ) -> tuple[dict[str, str], dict[str, int]]:
        results = [orjson.loads(store.read(part.output_object)) for part in parts]
        results.sort(key=lambda r: int(r["pages"][0]))
        prefix = job.output_prefix
        outputs = {
            "text.txt": f"{prefix}text.txt",
            "chunks.jsonl": f"{prefix}chunks.jsonl",
            "summary.json": f"{prefix}summary.json",
        }
        pages = [page for result in results for page in result["texts"]]
        # A text file's pages are cuts at line ends: joined as they were, they are the file.
        joiner = "" if self.kind == "text" else "\n\n"
        store.write(
            outputs["text.txt"],
            joiner.join(page["text"] for page in pages).encode(),
            "text/plain; charset=utf-8",
        )
        lines = b"".join(
            orjson.dumps(row) + b"\n" for result in results for row in result["chunks"]
        )
        store.write(outputs["chunks.jsonl"], lines, "application/jsonl")
        summaries = [{"pages": result["pages"], "summary": result["summary"]} for result in results]
        store.write(
            outputs["summary.json"],
            orjson.dumps(
                {
                    "summary": "\n\n".join(s["summary"] for s in summaries if s["summary"]),
                    "parts": summaries,
                },
                option=orjson.OPT_INDENT_2,
            ),
            "application/json",
        )
        chunk_count = sum(len(result["chunks"]) for result in results)
        return outputs, {"pages": len(pages), "chunks": chunk_count}


register(DocumentPipeline("pdf"))
register(DocumentPipeline("text"))
