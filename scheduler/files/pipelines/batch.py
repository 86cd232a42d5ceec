"""The JSON Lines batch pipeline: each line of an OpenAI Batch input through the gateway.

``plan`` cuts the input into parts of ``LINES_PER_PART`` requests and writes each part's lines
to an object of its own (so a part reads only its lines, not the whole input again);
``run_part`` sends a part's requests through the gateway a few at a time, at the job's priority
and under the use case's limits and guardrails, and writes one line per request in OpenAI's
batch output format; ``finish`` joins the parts, in order, into the output file (requests
answered 2xx) and the error file (the others), each an ApiFile of the batch's use case.

A request the gateway refuses for its content (a guardrail, a 4xx) is that line's error, not the
part's; 429 and 503 raise ``Retryable`` from the caller and the part is run again later (its
requests may then be sent twice: batch requests are at-least-once, as with any retry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from scheduler.files.pipelines.base import (
    GatewayCaller,
    JobContext,
    ObjectStore,
    PartFailed,
    PartResult,
    RequestRefused,
    register,
)

# The endpoints a line may call (scheduler/files/openai_files.py checks uploads on /v1/files against
# the same list; a batch uploaded over S3 was never checked, so each line is held to it here).
ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
LINES_PER_PART = 100
CONCURRENT_REQUESTS = 4
JSONL = "application/jsonl"


def _request_id(job: JobContext, custom_id: str) -> str:
    """Deterministic, so a part run again writes the same lines."""
    digest = hashlib.sha256(f"{job.registration_id}:{custom_id}".encode()).hexdigest()
    return f"batch_req_{digest[:24]}"


def _is_error(line: Mapping[str, Any]) -> bool:
    response = line.get("response")
    return line.get("error") is not None or not (
        isinstance(response, dict) and 200 <= int(response.get("status_code", 0)) < 300
    )


class BatchPipeline:
    kind = "batch"

    def plan(self, job: JobContext, store: ObjectStore) -> list[dict[str, Any]]:
        lines = [line for line in store.read(job.source_object).split(b"\n") if line.strip()]
        specs: list[dict[str, Any]] = []
        for index, first in enumerate(range(0, len(lines), LINES_PER_PART)):
            chunk = lines[first : first + LINES_PER_PART]
            name = f"{job.output_prefix}parts/in-{index:05d}.jsonl"
            store.write(name, b"\n".join(chunk) + b"\n", JSONL)
            specs.append({"object": name, "first_line": first + 1, "lines": len(chunk)})
        return specs

    def run_part(
        self,
        job: JobContext,
        spec: Mapping[str, Any],
        index: int,
        gateway: GatewayCaller,
        store: ObjectStore,
    ) -> PartResult:
        raw = [line for line in store.read(str(spec["object"])).split(b"\n") if line.strip()]
        items: list[dict[str, Any]] = []
        for offset, line in enumerate(raw):
            try:
                item = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                number = int(spec.get("first_line", 1)) + offset
                raise PartFailed(f"line {number} of the input is not JSON") from exc
            items.append(item)

        def one(item: dict[str, Any]) -> dict[str, Any]:
            return self._request(job, item, gateway)

        pool = ThreadPoolExecutor(max_workers=CONCURRENT_REQUESTS)
        try:
            futures = [pool.submit(one, item) for item in items]
            results = [future.result() for future in futures]  # the first Retryable, raised
        finally:
            # After a Retryable the requests not started yet never are: the part runs again.
            pool.shutdown(wait=True, cancel_futures=True)
        failed = sum(1 for line in results if _is_error(line))
        tokens = sum(
            int(line["response"]["body"].get("usage", {}).get("total_tokens", 0))
            for line in results
            if not _is_error(line) and isinstance(line["response"].get("body"), dict)
        )
        name = f"{job.output_prefix}parts/out-{index:05d}.jsonl"
        store.write(name, b"".join(orjson.dumps(line) + b"\n" for line in results), JSONL)
        return PartResult(
            output_object=name,
            tokens=tokens,
            counts={"total": len(results), "completed": len(results) - failed, "failed": failed},
        )

    def _request(
        self, job: JobContext, item: Mapping[str, Any], gateway: GatewayCaller
    ) -> dict[str, Any]:
        """One line's outcome, as OpenAI writes it; Retryable propagates."""
        custom_id = str(item.get("custom_id", ""))
        line: dict[str, Any] = {
            "id": _request_id(job, custom_id),
            "custom_id": custom_id,
            "response": None,
            "error": None,
        }
        url = str(item.get("url") or job.request_endpoint)
        body = item.get("body")
        if url not in ENDPOINTS:
            message = f"url must be one of {', '.join(sorted(ENDPOINTS))}"
            line["error"] = {"code": "invalid_url", "message": message}
            return line
        if not isinstance(body, dict):
            line["error"] = {"code": "invalid_request", "message": "body must be a JSON object"}
            return line
        try:
            answer = gateway.post_json(url, body)
        except RequestRefused as refused:
            # The gateway refused this request (a guardrail, a 4xx): OpenAI shows it as this
            # line's response, with the status and the gateway's error body.
            line["response"] = {
                "status_code": refused.status_code,
                "request_id": refused.request_id,
                "body": refused.body,
            }
            return line
        except PartFailed as refused:
            line["error"] = {"code": "request_failed", "message": str(refused)}
            return line
        line["response"] = {
            "status_code": 200,
            "request_id": str(answer.get("id", "")),
            "body": answer,
        }
        return line

    def finish(
        self, job: JobContext, parts: Sequence[PartResult], store: ObjectStore
    ) -> tuple[dict[str, str], dict[str, int]]:
        # Django models: imported when a job finishes, not when the registry is loaded.
        from scheduler.files.openai_files import batch_result_file

        output: list[bytes] = []
        errors: list[bytes] = []
        for part in parts:
            for raw in store.read(part.output_object).split(b"\n"):
                if raw.strip():
                    (errors if _is_error(orjson.loads(raw)) else output).append(raw + b"\n")
        outputs: dict[str, str] = {}
        for key, purpose, lines, name in (
            ("output_file_id", "batch_output", output, "output.jsonl"),
            ("error_file_id", "batch_error", errors, "errors.jsonl"),
        ):
            if not lines:
                continue  # as OpenAI: no file (null id) when no line went there
            content = b"".join(lines)
            object_name = f"{job.output_prefix}{name}"
            store.write(object_name, content, JSONL)
            outputs[key] = batch_result_file(
                registration_id=job.registration_id,
                purpose=purpose,
                object_name=object_name,
                content=content,
            )
        counts = {
            "total": len(output) + len(errors),
            "completed": len(output),
            "failed": len(errors),
        }
        return outputs, counts


register(BatchPipeline())
