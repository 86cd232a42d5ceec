"""The governance officer's forms: tenants, use cases, priority classes and the matrix."""
