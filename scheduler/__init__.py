"""Deferred GPU work, and nothing else: work that waits for capacity instead of a person.

- ``scheduler.batcher``: the dynamic batcher (``python -m scheduler.batcher``), async tasks
  from the gateway's Valkey streams to the fleet in wait-or-full batches.
- ``scheduler.files``: the files domain, file jobs with SLAs from registration to webhook.

The two know nothing of each other (an import contract says so). ``schedules.py`` lists every
periodic task by name. Not to be confused with ``gateway.scheduling``, the gateway's priority
queue and leases for interactive requests, which both of these use through the gateway.
"""
