"""The governance domain: tenants, use cases, models, API keys, and the policy snapshot."""
