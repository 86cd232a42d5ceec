"""A stand-in for a vLLM server on machines without GPUs.

It speaks vLLM 0.32's OpenAI-compatible HTTP API and Prometheus metrics closely enough that
the gateway, the tests and the benchmarks cannot tell it from a real replica (the contract
tests in tests/simulator/test_contract.py pass against both), and it models what the
gateway's scheduling depends on: continuous batching with a bounded batch, a bounded KV
cache, priority scheduling and a prefix cache (see ``engine``).

Run one replica with ``python -m simulator --port 8100 --served-model-name NAME``
(``--help`` lists the timing and fault options), or build it in-process with
``simulator.app.create_app(config)``. Faults can also be switched while it runs:
``GET``/``POST /sim/faults`` with ``{"error_rate": 0.1, "die_after_requests": 5, ...}``.
"""
