"""Guardrails: the detectors a use case's selections run, and the worker processes that run
them off the gateway's event loop.

Importing this package (or ``guardrails.base`` / ``guardrails.catalogue``) loads no model: the
governance side validates selections with the catalogue, the gateway speaks the service's
protocol; only ``guardrails.engine`` in a worker process imports the detectors themselves.
"""
