"""Domain errors. Each edge (API, portal, admin, CLI) maps them to its own words in one place.

Bad values raise Django's ``ValidationError``; a missing right raises Django's
``PermissionDenied``; these cover the rest.
"""

from __future__ import annotations


class GovernanceError(Exception):
    """Base of the domain's own errors."""


class Conflict(GovernanceError):
    """The action does not fit the record's current state (e.g. revealing a key twice)."""


class NotFound(GovernanceError):
    """A record kept outside the database (a Valkey stream entry) is gone, or not the
    person's to see: the two read the same, so that its existence does not leak."""
