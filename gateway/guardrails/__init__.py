"""Guardrails on the gateway's request path (docs/guardrails.md).

- ``plan``: which checks a use case runs at each stage and where, made once when the policy
  snapshot is parsed; pure, the one module of this package that gateway/policy.py imports.
- ``client``: the guardrail service's client and the ``FleetCaller`` seam to the fleet.
- ``fleet``: the checks a model on the fleet answers (a guard model, an embedding model).
- ``run``: a stage's checks run for a door, and what is recorded of each finding.
- ``stream``: a streamed answer held back a window at a time and checked.

Nothing is imported here: importing the plan must not load the clients.
"""
