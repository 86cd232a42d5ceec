"""Reading interaction records: who sees which, searching them, one transcript, exports.

The business rules of the auditors' side of records live here; the portal pages
(portal/records_views.py) and the API (records/api/records.py) only parse, call and render.

Who sees what (docs/records.md), enforced by ``records_visible_to`` and nowhere else:

- auditors, officers and admins read every record and its content;
- developers read the records of their own tenants' use cases whose
  ``records_visible_to_developers`` is set — metadata, and content where it was kept;
- everyone else reads nothing, and a record outside a person's scope is "not found".

Nobody changes or deletes a record here: retention does (records/interaction_retention.py).
Reading content goes through ``ObjectCache``, which checks the object's stored checksum, and
each line's own checksum; what does not match is shown as "cannot be verified", never as text.
"""

from records.reading.access import (
    may_search_records,
    record_tenants_visible,
    record_use_cases_visible,
    records_visible_to,
)
from records.reading.exports import (
    CONTENT_COLUMNS,
    EXPORT_COLUMNS,
    EXPORT_FORMATS,
    ExportRefused,
    export_check,
    export_content_type,
    export_filename,
    export_limit,
    records_export,
)
from records.reading.search import (
    RECORDS_PER_PAGE,
    RecordFilter,
    RecordRow,
    RecordSearchForm,
    UtcDateTimeField,
    record_rows,
    records_search,
)
from records.reading.transcripts import (
    AssembledChoice,
    AssembledStream,
    Transcript,
    TranscriptContent,
    assemble_stream,
    content_read,
    record_find,
    transcript_read,
)

__all__ = [
    "CONTENT_COLUMNS",
    "EXPORT_COLUMNS",
    "EXPORT_FORMATS",
    "RECORDS_PER_PAGE",
    "AssembledChoice",
    "AssembledStream",
    "ExportRefused",
    "RecordFilter",
    "RecordRow",
    "RecordSearchForm",
    "Transcript",
    "TranscriptContent",
    "UtcDateTimeField",
    "assemble_stream",
    "content_read",
    "export_check",
    "export_content_type",
    "export_filename",
    "export_limit",
    "may_search_records",
    "record_find",
    "record_rows",
    "record_tenants_visible",
    "record_use_cases_visible",
    "records_export",
    "records_search",
    "records_visible_to",
    "transcript_read",
]
