"""The files domain: a file registered with an SLA, answered at once (feasibility), uploaded
(S3 endpoint, API, OpenAI Files), run as a job through the gateway's own queue in its window,
its results stored and its end sent to a webhook (docs/files.md).

Layered bottom-up (an import contract holds it): pure parts (``feasibility``, ``leases``,
``filenames``, ``objects``, ``upload_events``) → the state machine (``states``) →
registration, S3 credentials, the OpenAI Files API, selectors, audited downloads → jobs,
pipelines, dispatch, uploads, webhooks, the OpenAI Batch API → ``api`` and ``tasks``. Its
tables are governance's (``FileRegistration``, ``S3Credential``, ``ApiFile``) except
``scheduler.models.FilePart``.
"""
