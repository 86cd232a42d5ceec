"""Usage charts of a use case and a developer's live budget (docs/portal.md "Usage and charts")."""
