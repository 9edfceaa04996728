"""What a request's engine events come to on the server's side: each token (``T`` with
its ``LP``), the end (``DONE`` with its stats) and the token counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata_core.contract import protocol as proto


@dataclass(frozen=True, slots=True)
class TokenEvent:
    id: int
    logprob: proto.Logprob | None = None


@dataclass
class Usage:
    """Token counts of a request (or of a reply's choices together)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    drafted: int = 0  # speculative tokens proposed / accepted (an extension)
    accepted: int = 0
    reasoning: int = 0  # completion tokens emitted while the reply reasoned (counted by the server)

    def add_choice(self, other: Usage, first_of_prompt: bool) -> None:
        """Fold one choice's usage in; its prompt's cache counts once per prompt."""
        self.completion += other.completion
        self.reasoning += other.reasoning
        self.drafted += other.drafted
        self.accepted += other.accepted
        if first_of_prompt:
            self.cached += other.cached

    @classmethod
    def from_stats(cls, stats: Mapping[str, str]) -> Usage:
        """A request's counts from its DONE stats."""
        return cls(*(int(stats.get(k, 0)) for k in ("prompt", "gen", "cached", "drafted", "accepted")))


@dataclass
class Finished:
    reason: str
    stats: Mapping[str, str]
    error: str | None = None
