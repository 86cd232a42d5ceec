"""Guardrails on the gateway's request path (docs/guardrails.md).

Which checks a use case runs at each stage, and where, is planned when the policy snapshot is
parsed: that pure plan is ``gateway.guardrail_plan``, beside gateway/policy.py and below this
package (the clients and runners here import the policy, the policy imports only the plan).

- ``client``: the guardrail service's client and the ``FleetCaller`` seam to the fleet.
- ``fleet``: the checks a model on the fleet answers (a guard model, an embedding model).
- ``run``: a stage's checks run for a door, and what is recorded of each finding.
- ``stream``: a streamed answer held back a window at a time and checked.

Nothing is imported here: importing one part must not load the others.
"""
