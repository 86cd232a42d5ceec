"""The floor every process stands on: typed environment variables, Valkey URLs and clients,
how a long-running asyncio service starts, raw-ASGI and multipart helpers, and the rule for
where an outbound URL may point. It imports nothing else of ours, and not Django: the gateway
and the simulator share it without loading the control plane."""
