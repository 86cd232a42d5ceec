"""ASGI entry point of the S3 endpoint process: ``uvicorn s3endpoint.asgi:app``.

Django is set up for its settings and the ORM (credentials, registrations), which run in
asgiref's worker thread; none of Django's request machinery is on the data path.
"""

from __future__ import annotations

import logging
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.conf import settings  # noqa: E402 - after django.setup()

from s3endpoint.app import EndpointConfig, S3Endpoint  # noqa: E402
from s3endpoint.upstream import UpstreamSettings  # noqa: E402

logging.basicConfig(
    level=os.environ.get("SWITCHYARD_LOG_LEVEL", "INFO"),
    format="%(asctime)s %(levelname)s %(name)s %(message)s",
)


def config_from_settings() -> EndpointConfig:
    return EndpointConfig(
        upstream=UpstreamSettings(
            endpoint_url=settings.S3_ENDPOINT_URL
            or f"https://s3.{settings.S3_REGION}.amazonaws.com",
            bucket=settings.FILES_BUCKET,
            access_key_id=settings.S3_ACCESS_KEY_ID,
            secret_access_key=settings.S3_SECRET_ACCESS_KEY,
            region=settings.S3_REGION,
        ),
        valkey_url=settings.VALKEY_URL,
        credential_ttl=settings.S3_CREDENTIAL_CACHE_SECONDS,
        cors_origins=tuple(settings.S3_ENDPOINT_CORS_ORIGINS),
    )


app = S3Endpoint(config_from_settings())
