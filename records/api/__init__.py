"""The records' part of ``/api/``: admission decisions, guardrail findings, interaction
records and the signed audit export (``urls.py``; config/api_urls.py joins it)."""
