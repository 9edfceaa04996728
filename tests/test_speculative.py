"""Speculative decoding: the verifier emits exactly the target's distribution.

(a) Exact enumeration over Fractions, through the real functions: every uniform is replaced
by one representative per cell of [0, 1) cut at the points where the decision it feeds can
change (the CDF of the row draw() samples, the acceptance ratio; for both the gated rule and
the naive rule), weighted by the cell's length. The primitive tests pin those cells (left
endpoint and midpoint agree), so the enumeration is exact. The emitted window, continued by
the target's own sampling to k + 1 tokens, must have exactly the target's joint law.
(b) Monte Carlo through the float path with Philox uniforms, chi-square against the target.
(c) The n-gram drafter.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction as F
from random import Random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_core.engine import philox
from strata_core.engine.speculation.ngram import NgramIndex
from strata_core.engine.speculation.verify import (
    NULL,
    STREAM_PROPOSE,
    WindowResult,
    WindowUniforms,
    accepts,
    admitted,
    draw,
    propose,
    residual,
    retained_measure,
    verify_exact,
    verify_window,
    window_uniforms,
)

Prefix = tuple[int, ...]
Model = Callable[[Prefix], list[F]]  # context -> the distribution of the next token
Window = Callable[..., WindowResult]


def naive_gated_window(
    p_rows: Sequence[Any],
    q_rows: Sequence[Any],
    drafted: Sequence[int],
    tau: Any,
    uniforms: WindowUniforms,
) -> WindowResult:
    """NEGATIVE CONTROL, never use: the original, biased form of the gated rule. The gate only
    decides what is offered; the verifier still uses the unfiltered q (accept with
    min(1, p/q), residual (p - q)+) and a failed gate becomes a plain target sample."""
    for i, x in enumerate(drafted):
        p, q = np.asarray(p_rows[i]), np.asarray(q_rows[i])
        if x == NULL:
            return WindowResult(i, draw(p, uniforms.emit[i]))
        if not accepts(p[x], q[x], uniforms.accept[i]):
            return WindowResult(i, draw(residual(p, q), uniforms.emit[i]))
    return WindowResult(len(drafted), draw(p_rows[len(drafted)], uniforms.emit[len(drafted)]))


# ---------------------------------------------------------------- exact enumeration helpers


def frac_row(*xs: int | str | F) -> list[F]:
    row = [F(x) for x in xs]
    assert sum(row) == 1
    return row


def cdf(w: Sequence[F]) -> list[F]:
    total = sum(w, F(0))
    return list(itertools.accumulate(x / total for x in w)) if total else []


def cells(cuts: Sequence[F]) -> list[tuple[F, F, F]]:
    """(left end, midpoint, length) of each cell of [0, 1) cut at cuts."""
    pts = sorted({F(0), F(1)} | {F(c) for c in cuts if 0 < c < 1})
    return [(a, (a + b) / 2, b - a) for a, b in zip(pts, pts[1:], strict=False)]


def law_of(fn: Callable[[F], Any], cuts: Sequence[F]) -> dict[Any, F]:
    """Exact law of fn(u), u ~ U[0, 1), for fn constant on the cells (checked)."""
    law: dict[Any, F] = defaultdict(F)
    for left, mid, length in cells(cuts):
        out = fn(mid)
        assert fn(left) == out, f"fn changes inside the cell starting at {left}"
        law[out] += length
    return dict(law)


def mu_of(q: Sequence[F], tau: F) -> list[F]:
    return [x if x >= tau else F(0) for x in q]


def positive_part(p: Sequence[F], m: Sequence[F]) -> list[F]:
    return [max(a - b, F(0)) for a, b in zip(p, m, strict=True)]


class _Unassigned(Exception):
    pass


class _Given:
    """Uniforms the enumerator has fixed so far; reading any other one asks it to branch."""

    def __init__(self, stream: str, given: dict[tuple[str, int], F]) -> None:
        self.stream, self.given = stream, given

    def __getitem__(self, i: int) -> F:
        if (self.stream, i) not in self.given:
            raise _Unassigned((self.stream, i))
        return self.given[self.stream, i]


def draft_law(q_of: Model, tau: F, k: int) -> dict[tuple[int, ...], F]:
    """Exact law of the drafter's k gated proposals (the real ``propose``); stops at NULL."""
    law: dict[tuple[int, ...], F] = {}

    def extend(drafted: tuple[int, ...], w: F) -> None:
        if len(drafted) == k:
            law[drafted] = w
            return
        q = q_of(drafted)
        for x, wx in law_of(lambda u: propose(q, tau, u), cdf(q)).items():
            if x == NULL:
                law[drafted + (NULL,)] = w * wx
            else:
                extend(drafted + (x,), w * wx)

    extend((), F(1))
    return law


def verdict_law(
    window: Window, p_rows: list[list[F]], q_rows: list[list[F]], drafted: Sequence[int], tau: F
) -> dict[tuple[int, int], F]:
    """Exact law of window(...) over its accept and emit uniforms, read lazily."""
    law: dict[tuple[int, int], F] = defaultdict(F)
    todo: list[tuple[dict[tuple[str, int], F], F]] = [({}, F(1))]
    while todo:
        given, w = todo.pop()
        uniforms = WindowUniforms(_Given("accept", given), _Given("emit", given))  # type: ignore[arg-type]
        try:
            verdict = window(p_rows, q_rows, drafted, tau, uniforms)
        except _Unassigned as e:
            stream, i = key = e.args[0]
            p = p_rows[i]
            q = q_rows[i] if i < len(q_rows) else None
            # cut where accepts() or draw() can change (pinned by the primitive tests above):
            # an offered x is admitted, so mu(x) = q(x); draw() cuts at its row's CDF
            if stream == "accept":
                assert q is not None
                cuts = [p[drafted[i]] / q[drafted[i]]]
            else:
                cuts = cdf(p)
                if q is not None:
                    gated = residual(p, retained_measure(q, tau))
                    cuts += cdf(list(gated)) + cdf(positive_part(p, q))
            todo += [({**given, key: mid}, w * length) for _, mid, length in cells(cuts)]
            continue
        law[verdict.accepted, verdict.token] += w
    return dict(law)


def window_law(window: Window, p_of: Model, q_of: Model, tau: F, k: int) -> dict[Prefix, F]:
    """Exact law of the tokens one drafted-and-verified window emits."""
    law: dict[Prefix, F] = defaultdict(F)
    for drafted, w in draft_law(q_of, tau, k).items():
        tokens = drafted[:-1] if drafted and drafted[-1] == NULL else drafted
        p_rows = [p_of(tokens[:i]) for i in range(len(tokens) + 1)]
        q_rows = [q_of(drafted[:i]) for i in range(len(drafted))]
        for (n, token), wv in verdict_law(window, p_rows, q_rows, drafted, tau).items():
            law[tokens[:n] + (token,)] += w * wv
    return dict(law)


def continued(law: dict[Prefix, F], p_of: Model, vocab: int, length: int) -> dict[Prefix, F]:
    """The law of `length` tokens: each emitted prefix continued by the target's sampling."""
    out: dict[Prefix, F] = defaultdict(F)
    for prefix, w in law.items():
        for rest in itertools.product(range(vocab), repeat=length - len(prefix)):
            s, prob = prefix + rest, w
            for i in range(len(prefix), length):
                prob *= p_of(s[:i])[s[i]]
            if prob:
                out[s] += prob
    return dict(out)


def target_law(p_of: Model, vocab: int, length: int) -> dict[Prefix, F]:
    return continued({(): F(1)}, p_of, vocab, length)


def first_token(law: dict[Prefix, F]) -> dict[int, F]:
    out: dict[int, F] = defaultdict(F)
    for prefix, w in law.items():
        out[prefix[0]] += w
    return dict(out)


def rolled(row: list[F]) -> Model:
    """A context-dependent model: row rotated by a function of the context."""

    def of(ctx: Prefix) -> list[F]:
        s = (len(ctx) + 2 * sum(ctx)) % len(row)
        return row[-s:] + row[:-s] if s else list(row)

    return of


def random_model(seed: int, vocab: int, zeros: bool = True) -> Model:
    """A different random Fraction row for every context, fixed by (seed, context)."""
    cache: dict[Prefix, list[F]] = {}

    def row(ctx: Prefix) -> list[F]:
        if ctx not in cache:
            rng = Random(f"{seed}:{ctx}")
            w = [rng.choice([0, 1, 1, 2, 3, 5] if zeros else [1, 2, 3, 5]) for _ in range(vocab)]
            w[rng.randrange(vocab)] += 1
            cache[ctx] = [F(x, sum(w)) for x in w]
        return cache[ctx]

    return row


# ---------------------------------------------------------------- (a) primitives, exactly


def test_gate_admits_q_equal_to_tau() -> None:
    q, tau = frac_row("1/2", "1/4", "1/4"), F(1, 4)
    assert admitted(q[1], tau) and not admitted(q[1], F(1, 3))
    assert list(retained_measure(q, tau)) == q
    assert list(retained_measure(q, F(1, 3))) == [F(1, 2), 0, 0]
    assert list(retained_measure(q, F(3, 4))) == [0, 0, 0]


def test_draw_is_the_inverse_cdf_in_id_order() -> None:
    w = frac_row(0, "1/3", 0, "1/2", "1/6", 0)
    assert law_of(lambda u: draw(w, u), cdf(w)) == {1: F(1, 3), 3: F(1, 2), 4: F(1, 6)}
    assert draw(w, F(1, 3)) == 3  # cells are [a, b): the cut belongs to the next id
    assert draw(np.array([0.0, 0.3, 0.3, 0.0]), 1 - 2**-53) == 2  # never a zero-mass id
    with pytest.raises(ValueError, match="no positive mass"):
        draw([0.0, 0.0], 0.5)


@pytest.mark.parametrize("tau", [F(0), F(1, 8), F(1, 4), F(1, 3), F(3, 4)])
def test_propose_offers_mu_and_null_gets_the_rest(tau: F) -> None:
    q = frac_row("1/2", "1/4", 0, "1/4")
    law = law_of(lambda u: propose(q, tau, u), cdf(q))
    mu = mu_of(q, tau)
    expected = {x: m for x, m in enumerate(mu) if m} | ({NULL: 1 - sum(mu)} if sum(mu) < 1 else {})
    assert law == expected


def test_accept_probability_is_min_one_p_over_mu() -> None:
    for p_x, mu_x in [(F(1, 2), F(7, 8)), (F(1, 3), F(1, 3)), (F(2, 3), F(1, 4)), (F(0), F(1, 2))]:
        ratio = min(F(1), p_x / mu_x)
        assert (
            law_of(lambda u, p_x=p_x, mu_x=mu_x: accepts(p_x, mu_x, u), [ratio]).get(True, F(0))
            == ratio
        )
    with pytest.raises(ValueError, match="mu"):
        accepts(F(1, 2), F(0), F(0))


def test_residual_is_the_normalised_positive_part() -> None:
    p, mu = frac_row("1/2", "1/2", 0), [F(7, 8), F(0), F(0)]
    assert list(residual(p, mu)) == [0, 1, 0]
    p, mu = frac_row("1/4", "1/4", "1/2"), [F(1, 8), F(1, 2), F(0)]
    assert list(residual(p, mu)) == [F(1, 5), 0, F(4, 5)]
    assert list(residual(p, p)) == p  # no positive part: unreachable exactly, a rounding guard
    assert np.allclose(residual(np.array([0.2, 0.8]), np.array([0.5, 0.1])), [0.0, 1.0])


# ---------------------------------------------------------------- (a) windows, exactly

REF_P, REF_Q = frac_row("1/2", "1/2"), frac_row("7/8", "1/8")

# name: (p row, q row, tau, k); rows are rotated by context so each row differs by position
CASES: dict[str, tuple[list[F], list[F], F, int]] = {
    "reference": (REF_P, REF_Q, F(1, 2), 1),
    "reference k=3": (REF_P, REF_Q, F(1, 2), 3),
    "tau 0 (plain speculative sampling)": (
        frac_row("1/6", "1/3", "1/2"),
        frac_row("1/2", "1/4", "1/4"),
        F(0),
        3,
    ),
    "tau below every q": (frac_row("1/6", "1/3", "1/2"), frac_row("1/2", "1/4", "1/4"), F(1, 8), 3),
    "tau between the q values": (
        frac_row("1/6", "1/3", "1/2"),
        frac_row("1/2", "1/4", "1/4"),
        F(1, 3),
        3,
    ),
    "tau equal to a q value": (
        frac_row("1/6", "1/3", "1/2"),
        frac_row("1/2", "1/4", "1/4"),
        F(1, 4),
        3,
    ),
    "tau above every q": (frac_row("1/6", "1/3", "1/2"), frac_row("1/2", "1/4", "1/4"), F(3, 4), 2),
    "point-mass q": (frac_row("1/4", "1/4", "1/2", 0), frac_row(0, 1, 0, 0), F(1, 2), 3),
    "zeros in p": (
        frac_row(0, "1/2", 0, "3/8", "1/8"),
        frac_row("1/5", "1/5", "2/5", "1/10", "1/10"),
        F(1, 6),
        2,
    ),
    "q = 0 where p > 0": (
        frac_row("1/4", "1/4", "1/4", "1/4"),
        frac_row("2/3", "1/3", 0, 0),
        F(1, 4),
        3,
    ),
    "q = 0 where p > 0, gated": (
        frac_row("1/4", "1/4", "1/4", "1/4"),
        frac_row("2/3", "1/3", 0, 0),
        F(1, 2),
        3,
    ),
    "p = q": (frac_row("1/8", "3/8", "1/2"), frac_row("1/8", "3/8", "1/2"), F(1, 4), 3),
    "p = q, tau 0": (frac_row("1/8", "3/8", "1/2"), frac_row("1/8", "3/8", "1/2"), F(0), 3),
    "disjoint supports": (frac_row("1/2", "1/2", 0, 0), frac_row(0, 0, "2/3", "1/3"), F(1, 3), 3),
    "six tokens": (
        frac_row("1/12", "1/6", 0, "1/4", "1/3", "1/6"),
        frac_row("1/3", "1/6", "1/4", 0, "1/12", "1/6"),
        F(1, 6),
        3,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_gated_window_emits_the_target_law(name: str) -> None:
    p, q, tau, k = CASES[name]
    p_of, q_of = rolled(p), rolled(q)
    law = window_law(verify_window, p_of, q_of, tau, k)
    assert sum(law.values()) == 1
    assert continued(law, p_of, len(p), k + 1) == target_law(p_of, len(p), k + 1)


@pytest.mark.parametrize("seed", range(12))
def test_gated_window_emits_the_target_law_random(seed: int) -> None:
    rng = Random(seed)
    vocab = rng.randint(2, 5)
    k = 3 if vocab <= 4 else 2  # V**k drafts: keep the enumeration quick
    p_of, q_of = (
        random_model(2 * seed, vocab),
        random_model(2 * seed + 1, vocab, zeros=seed % 2 == 0),
    )
    q0 = sorted(set(q_of(())))
    tau = rng.choice([F(0), q0[0], (q0[0] + q0[-1]) / 2, q0[-1], q0[-1] + F(1, 100)])
    law = window_law(verify_window, p_of, q_of, tau, k)
    assert continued(law, p_of, vocab, k + 1) == target_law(p_of, vocab, k + 1)


def test_reference_case_correct_and_naive_rule() -> None:
    """The gated rule's worked example: p=(0.5,0.5), q=(0.875,0.125), threshold 0.5."""
    p_of, q_of = (lambda ctx: REF_P), (lambda ctx: REF_Q)
    assert first_token(window_law(verify_window, p_of, q_of, F(1, 2), 1)) == {
        0: F(1, 2),
        1: F(1, 2),
    }
    naive = first_token(window_law(naive_gated_window, p_of, q_of, F(1, 2), 1))
    assert naive == {0: F(9, 16), 1: F(7, 16)}  # 0.5625, 0.4375


@pytest.mark.parametrize(
    "name", ["reference k=3", "tau between the q values", "q = 0 where p > 0, gated"]
)
def test_naive_rule_fails_the_enumeration(name: str) -> None:
    p, q, tau, k = CASES[name]
    p_of, q_of = rolled(p), rolled(q)
    assert any(x == NULL for d in draft_law(q_of, tau, k) for x in d)  # the gate is active
    naive = window_law(naive_gated_window, p_of, q_of, tau, k)
    assert sum(naive.values()) == 1
    assert continued(naive, p_of, len(p), k + 1) != target_law(p_of, len(p), k + 1)


def test_without_a_gate_the_two_rules_coincide() -> None:
    """tau = 0 admits everything: mu = q, no NULL, both are plain speculative sampling."""
    p_of, q_of = random_model(7, 4), random_model(8, 4)
    assert window_law(naive_gated_window, p_of, q_of, F(0), 2) == window_law(
        verify_window, p_of, q_of, F(0), 2
    )


@pytest.mark.parametrize("vocab,k", [(2, 3), (4, 3), (6, 2)])
def test_exact_match_of_point_mass_drafts_emits_the_target_law(vocab: int, k: int) -> None:
    p_of = random_model(100 + vocab, vocab)
    for draft in [(0,) * k, tuple(range(k)), tuple((vocab - 1 - i) % vocab for i in range(k))]:
        law: dict[Prefix, F] = defaultdict(F)
        for samples in itertools.product(range(vocab), repeat=k + 1):
            w = math.prod((p_of(draft[:i])[t] for i, t in enumerate(samples)), start=F(1))
            if w:
                n = verify_exact(samples, draft)
                law[draft[:n] + (samples[n],)] += w
        assert continued(law, p_of, vocab, k + 1) == target_law(p_of, vocab, k + 1)


def test_verify_exact_counts_the_matching_prefix() -> None:
    assert verify_exact([5, 6, 7, 8], [5, 6, 7]) == 3
    assert verify_exact([5, 9, 7, 8], [5, 6, 7]) == 1
    assert verify_exact([4, 6, 7, 8], [5, 6, 7]) == 0
    assert verify_exact([3], []) == 0
    with pytest.raises(ValueError, match="target samples"):
        verify_exact([5, 6, 7], [5, 6, 7])


def test_verify_window_checks_its_inputs() -> None:
    u = WindowUniforms([0.5] * 3, [0.5] * 3)
    p, q = [0.5, 0.5], [0.9, 0.1]
    with pytest.raises(ValueError, match="NULL before its end"):
        verify_window([p, p], [q, q], [NULL, 0], 0.5, u)
    with pytest.raises(ValueError, match="p rows"):
        verify_window([p, p], [q], [NULL], 0.5, u)
    with pytest.raises(ValueError, match="q rows"):
        verify_window([p, p], [q, q], [0], 0.5, u)
    with pytest.raises(ValueError, match="mu"):  # token 1 is not admitted at tau 0.5
        verify_window([p, p], [q], [1], 0.5, u)
    assert verify_window([p], [q], [NULL], 0.5, u) == (0, 1)  # NULL: the residual (0, 1)


# ---------------------------------------------------------------- (b) Monte Carlo, float path

MC_P = np.array(
    [
        [0.35, 0.25, 0.20, 0.15, 0.05],
        [0.10, 0.40, 0.00, 0.30, 0.20],
        [0.20, 0.20, 0.20, 0.20, 0.20],
        [0.05, 0.15, 0.50, 0.00, 0.30],
    ]
)
MC_Q = np.array(
    [
        [0.60, 0.10, 0.10, 0.15, 0.05],
        [0.05, 0.70, 0.05, 0.10, 0.10],
        [0.40, 0.00, 0.30, 0.20, 0.10],
    ]
)
MC_TAU = 0.12
CHI2_Z_999 = 3.090232306167813  # standard normal quantile at 0.999


def chi2_critical_999(dof: int) -> float:
    """Wilson-Hilferty approximation of the chi-square 0.999 quantile (scipy-free);
    slightly above the exact value (conservative) for dof >= 4, see the test below."""
    h = 2 / (9 * dof)
    return dof * (1 - h + CHI2_Z_999 * math.sqrt(h)) ** 3


def test_chi2_critical_matches_tables() -> None:
    for dof, table in [(4, 18.467), (24, 51.179), (100, 149.449), (400, 493.132)]:
        assert table <= chi2_critical_999(dof) <= table * 1.015


def mc_counts(window: Window, trials: int, seed0: int) -> np.ndarray:
    """Counts of the 4 tokens one window emits, continued by ordinary target sampling."""
    k = MC_Q.shape[0]
    counts = np.zeros((MC_P.shape[1],) * (k + 1), np.int64)
    for t in range(trials):
        seed = seed0 + t
        drafted: list[int] = []
        for i in range(k):
            drafted.append(propose(MC_Q[i], MC_TAU, philox.uniform(seed, i, STREAM_PROPOSE)))
            if drafted[-1] == NULL:
                break
        offered = len(drafted) - (drafted[-1] == NULL)
        n, token = window(
            MC_P[: offered + 1],
            MC_Q[: len(drafted)],
            drafted,
            MC_TAU,
            window_uniforms(seed, 0, offered + 1),
        )
        seq = drafted[:n] + [token]
        seq += [draw(MC_P[j], philox.uniform(seed, j, 0)) for j in range(len(seq), k + 1)]
        counts[tuple(seq)] += 1
    return counts


def chi2_statistic(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic; cells expecting fewer than 5 are pooled into one."""
    n = counts.sum()
    expected, observed = probs.ravel() * n, counts.ravel().astype(float)
    assert observed[expected == 0].sum() == 0, "a token the target cannot emit was emitted"
    big, rare = expected >= 5, (expected > 0) & (expected < 5)
    e, o = expected[big], observed[big]
    if rare.any():
        e, o = np.append(e, expected[rare].sum()), np.append(o, observed[rare].sum())
    return float(((o - e) ** 2 / e).sum()), e.size - 1


MC_TARGET = np.einsum("a,b,c,d->abcd", *MC_P)  # rows depend on position only


def test_monte_carlo_gated_window_matches_the_target() -> None:
    counts = mc_counts(verify_window, 10_000, seed0=1)
    stat, dof = chi2_statistic(counts, MC_TARGET)
    assert stat < chi2_critical_999(dof), (stat, dof)
    for axis in range(4):  # each position's marginal as well
        stat, dof = chi2_statistic(
            counts.sum(axis=tuple(a for a in range(4) if a != axis)), MC_P[axis]
        )
        assert stat < chi2_critical_999(dof), (axis, stat, dof)


def test_monte_carlo_rejects_the_naive_rule() -> None:
    """The same harness has the power to see the biased rule (its statistic is ~3x)."""
    stat, dof = chi2_statistic(mc_counts(naive_gated_window, 5_000, seed0=1), MC_TARGET)
    assert stat > chi2_critical_999(dof), (stat, dof)


# ---------------------------------------------------------------- (c) n-gram drafter


def ngram_draft(tokens: Sequence[int] | np.ndarray, k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """What the scheduler drafts: an index over the whole stream."""
    return NgramIndex([int(x) for x in tokens], n_max=n_max, n_min=n_min).draft(k)


def scan_draft(
    tokens: Sequence[int] | np.ndarray, k: int, n_max: int = 3, n_min: int = 1
) -> list[int]:
    """The n-gram draft by its definition, scanning the whole stream: the reference
    ``NgramIndex`` must agree with as the stream grows."""
    if k < 0:
        raise ValueError(f"k={k} is out of range: expected >= 0")
    if not 1 <= n_min <= n_max:
        raise ValueError(
            f"n_min={n_min}, n_max={n_max} are out of range: expected 1 <= n_min <= n_max"
        )
    a = np.asarray(tokens, dtype=np.int64)
    if k == 0 or a.size <= n_min:
        return []
    last = a.size - 1
    ends = np.flatnonzero(a[:last] == a[last])  # earlier occurrences of the last token
    n = 1
    while n < n_max and ends.size:  # keep those that also match one more token back
        longer = ends[ends >= n]
        longer = longer[a[longer - n] == a[last - n]]
        if not longer.size:
            break
        ends, n = longer, n + 1
    if n < n_min or not ends.size:
        return []
    e = int(ends[-1])  # the most recent
    return [int(t) for t in a[e + 1 : e + 1 + k]]




def test_ngram_finds_the_most_recent_match() -> None:
    assert ngram_draft([1, 2, 9, 1, 2, 8, 5, 1, 2], k=2) == [8, 5]
    assert ngram_draft(np.array([7, 3, 4, 7, 5, 6, 7]), k=3, n_max=1) == [5, 6, 7]


def test_ngram_prefers_the_longer_ngram() -> None:
    # "3 1 2" last occurred at the start; a bare "1 2" is more recent
    tokens = [3, 1, 2, 4, 4, 1, 2, 5, 3, 1, 2]
    assert ngram_draft(tokens, k=2) == [4, 4]
    assert ngram_draft(tokens, k=2, n_max=2) == [5, 3]
    assert ngram_draft([5, 2, 6, 2], k=1, n_max=3) == [6]  # falls back to a unigram


def test_ngram_respects_n_min_and_k() -> None:
    assert ngram_draft([5, 2, 6, 2], k=1, n_min=2) == []
    assert ngram_draft([1, 2, 3, 1, 2], k=0) == []
    assert ngram_draft([1, 2, 3, 4, 1, 2], k=10) == [3, 4, 1, 2]  # runs into the suffix
    assert ngram_draft([4, 4, 4, 4], k=3) == [4]  # "4 4 4" ended at 2; one token follows
    with pytest.raises(ValueError, match="n_min"):
        ngram_draft([1, 2], k=1, n_min=3, n_max=2)


def test_ngram_without_a_match_drafts_nothing() -> None:
    assert ngram_draft([1, 2, 3, 4], k=4) == []
    assert ngram_draft([], k=4) == []
    assert ngram_draft([7], k=4) == []


def test_ngram_long_context_is_fast_and_agrees_with_a_plain_scan() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        tokens = rng.integers(0, 6, 4096).tolist()
        for n in (3, 2, 1):  # the plain definition
            suffix = tokens[-n:]
            starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
            if starts:
                expected = tokens[starts[-1] + n : starts[-1] + n + 5]
                break
        assert ngram_draft(tokens, k=5) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 4), max_size=60),
    st.integers(0, 6),
    st.integers(1, 4),
    st.integers(1, 4),
    st.lists(st.sampled_from(["draft", "index", "append"]), min_size=60, max_size=60),
)
def test_ngram_index_drafts_what_the_scan_drafts_as_the_stream_grows(
    tokens: list[int], k: int, n_max: int, n_min: int, calls: list[str]
) -> None:
    """However appends, index() calls (the scheduler's, while a step computes) and drafts
    interleave, a draft is the scan's over the whole stream so far."""
    n_min = min(n_min, n_max)
    start = min(5, len(tokens))
    index = NgramIndex(tokens[:start], n_max=n_max, n_min=n_min)
    drafted = 0
    for i in range(start, len(tokens) + 1):
        if calls[i - start] == "draft" or i == len(tokens):
            assert index.draft(k) == scan_draft(tokens[:i], k, n_max=n_max, n_min=n_min)
            drafted += 1
        elif calls[i - start] == "index":
            index.index()
        if i < len(tokens):
            index.append(tokens[i])
    assert drafted >= 1
