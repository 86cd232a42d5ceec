"""The dynamic batcher (``python -m scheduler.batcher``): async tasks from the Valkey streams
to the fleet, wait-or-full, through the gateway's own admission (docs/async.md, "The batcher").

Imports gateway/ (the contract, the scheduler, the fleet client) and never the ORM.
"""
