"""The gateway's /v1 contract (gateway/openapi.yaml), served at ``GET /v1/openapi.json``.

Read and serialised once, when the gateway is built: the route answers fixed bytes and no
request pays for the document. A document that does not parse stops the gateway at start,
not its first caller.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

PATH = "/v1/openapi.json"
SOURCE = Path(__file__).with_name("openapi.yaml")


def load(source: Path = SOURCE) -> bytes:
    """The document as JSON bytes."""
    document = yaml.safe_load(source.read_bytes())
    if not isinstance(document, dict) or "paths" not in document:
        raise ValueError(f"{source} is not an OpenAPI document.")
    return orjson.dumps(document)
