"""The async task API: submit, poll, and its contract with the batcher (layout)."""
