"""What goes wrong with a policy file, each problem pointing at a place in the file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from governance.errors import GovernanceError


@dataclass(frozen=True)
class Problem:
    """One problem at one place: ``path`` reads like ``use_cases[acme/chatbot].limits``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyInvalid(GovernanceError):
    """The file cannot be applied as it stands; ``problems`` lists every reason found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


class PolicyApplyFailed(PolicyInvalid):
    """A service refused one change while applying; the whole apply was rolled back."""
