"""A large export streams: the process never holds the whole file.

Under ASGI the export is pulled chunk by chunk through an async iterator; if it were handed
to Django as a sync iterator, Django would gather every chunk before sending the first, and
memory would grow with the export. Here the peak of Python allocations while 40,000 records
stream is a fraction of the export's size.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from governance.roles import Role
from records.models import InteractionRecord
from testkit.factories import make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db

RECORDS = 40_000


def test_a_large_export_is_sent_without_holding_it_in_memory() -> None:
    chatbot = make_use_case(make_tenant("acme"), "chatbot")
    template = make_record(chatbot)
    rows = []
    for number in range(RECORDS - 1):
        row = InteractionRecord(
            **{
                f.attname: getattr(template, f.attname)
                for f in InteractionRecord._meta.concrete_fields
                if f.attname != "id"
            }
        )
        row.record_id = f"{number:032x}"
        row.request_id = f"req-{number}"
        rows.append(row)
    InteractionRecord.objects.bulk_create(rows, batch_size=2000)
    del rows
    auditor: Any = make_user("audrey", Role.AUDITOR)

    async def export() -> tuple[int, int, int]:
        client = AsyncClient()
        await client.aforce_login(auditor)
        response: Any = await client.get("/records/export/", {"format": "csv"})
        assert response.is_async
        size = chunks = 0
        tracemalloc.start()
        try:
            async for chunk in response.streaming_content:
                size += len(chunk)
                chunks += 1
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return size, chunks, peak

    size, chunks, peak = async_to_sync(export)()

    assert chunks >= RECORDS // 200
    assert size > 6_000_000, size
    assert peak < size / 4, f"peak {peak:,} bytes while streaming {size:,}"
