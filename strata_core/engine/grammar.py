"""Constrained decoding with llguidance: one matcher per request (grammar sources: grammars.py).

A request's ``grammar`` GEN value (protocol.parse_grammar) becomes an llguidance grammar
(``llguidance_grammar``), then a :class:`GrammarMatcher` over the engine's one tokenizer. Before
each sample the constraint gives the permitted tokens as a boolean row (the sampler's
``mask``); the sampled token is then consumed. The matcher only ever consumes emitted
tokens, so a speculative window needs no rollback: each row is sampled under the mask of
the tokens kept before it, and the first mismatch ends the window (scheduler._verify).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import llguidance
import numpy as np
import numpy.typing as npt

from strata_core.contract import protocol as proto
from strata_core.text.grammars import llguidance_grammar, short_error


class GrammarMatcher:
    """One request's matcher: the permitted tokens before a sample, and the tokens taken."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    def refusal(self) -> str:
        """The ERR message for a matcher in error: a short reason for the client; the whole
        of llguidance's message (with its parser state) goes to the engine's log."""
        return _refusal(self.error)

    @property
    def stopped(self) -> bool:
        """Nothing but end-of-generation may follow: the value is complete."""
        return self.matcher.is_stopped()

    def mask(self) -> npt.NDArray[np.bool_] | None:
        """True where a token is permitted next; None when the matcher is in error."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        if self.matcher.is_error():
            return None
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(np.bool_)

    def consume(self, token: int) -> bool:
        return self.matcher.consume_token(token)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar permits in a row from here (consumes nothing)."""
        return self.matcher.validate_tokens(list(tokens)) if tokens else 0


class Grammars:
    """The engine's grammar facility: one llguidance tokenizer, built on first use so a
    request without a grammar never pays for it, and a GrammarMatcher per request."""

    def __init__(self, make_tokenizer: Callable[[], llguidance.LLTokenizer], n_vocab: int) -> None:
        self._make_tokenizer = make_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self.n_vocab = n_vocab

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._make_tokenizer()
        return self._tokenizer

    def matcher(self, value: str) -> GrammarMatcher:
        """A GrammarMatcher for a ``grammar`` GEN value; ValueError saying why it is refused."""
        try:
            kind, text = proto.parse_grammar(value)
            grammar = llguidance_grammar(kind, text)
        except (proto.ProtocolError, ValueError) as exc:
            raise ValueError(_refusal(str(exc))) from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(_refusal(matcher.get_error()))
        return GrammarMatcher(matcher, self.n_vocab)


def _refusal(message: str) -> str:
    print(f"grammar refused: {message}", file=sys.stderr, flush=True)
    return f"{proto.GRAMMAR_REFUSED} {short_error(message)}"
