"""The files domain's HTTP: registrations, S3 credentials and webhooks under ``/api/``
(``urls.py``), and the OpenAI Files and Batch APIs under ``/v1/`` (``openai_batch.py``)."""
