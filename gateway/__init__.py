"""The data path: the OpenAI-compatible ASGI gateway and the fleet it forwards to.

Nothing under this package may import Django models: the gateway runs as its own lean
process and reads governance decisions from the Valkey policy snapshot only.
"""
