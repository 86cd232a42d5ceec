"""Every write to the governance domain: authorised, validated, audited, republished.

Views, the admin, the portal and policy-as-code all call these, so the rules hold whatever
the door. Each service takes an ``Actor`` (who, from where); the ones a person can trigger
check that person's role and tenant. Every change that the gateway reads republishes the
policy snapshot once the transaction commits. One module per aggregate, import from it:

- ``generic_records``: create, change, delete any governance record (tenants, models,
  deployments, selections, policies), officers only
- ``use_cases``: drafts, developer fields, the lifecycle (submit, approve, suspend, …)
- ``guardrail_selections``: add, change, remove, reorder a use case's guardrails; fail mode
- ``record_policy``: what the gateway records, for how long, who reads it; legal holds
- ``api_keys``: request, decide, reveal, rotate, revoke, issue
- shared by them: ``authority`` (who may act), ``republish`` (the snapshot, once per commit),
  ``record_bounds`` (retention and hold rules every door keeps), ``guardrail_positions``
  (a use case's selections: locked, validated, numbered)
"""
