"""The adaptive speculation policy: when a window pays and how long it is."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from strata_core.engine.speculation.cost import (
    CPU_MARGIN,
    MARGIN,
    Acceptance,
    Calibration,
    Shadow,
    StepCost,
    WindowGuard,
    expected_kept,
    isotonic,
    uniform_window,
    window_size,
)
from strata_core.engine.ubatch import micro_batches


@pytest.mark.parametrize("alpha", [Fraction(0), Fraction(1, 3), Fraction(1, 2), Fraction(9, 10), Fraction(1)])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_expected_kept_sums_the_run_probabilities(alpha: Fraction, k: int) -> None:
    # P(the first j drafts are all kept) = alpha**j, and E[kept] sums them over j = 1..k
    assert expected_kept(alpha, k) == sum(alpha**j for j in range(1, k + 1))  # type: ignore[arg-type]


def test_expected_kept_matches_simulated_runs() -> None:
    rng = random.Random(7)
    alpha, k, n = 0.7, 4, 40_000
    total = 0
    for _ in range(n):
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        total += kept
    assert abs(total / n - expected_kept(alpha, k)) < 0.03


def free(rows: int) -> float:
    return 1.0


def proportional(rows: int) -> float:
    return 0.012 * rows


def two_cpu_cores(rows: int) -> float:  # the default model, measured: 1 row 11.6 ms, 5 rows 39 ms
    return 0.0116 + 0.00685 * (rows - 1)


def test_free_rows_take_the_longest_window() -> None:
    assert window_size(alpha=0.2, k_max=6, seconds=free, rows=1, tokens=1) == 6


def test_rows_costing_as_much_as_a_step_never_pay() -> None:
    # a window of k costs k more steps and keeps fewer than k drafts on average
    for alpha in (0.1, 0.5, 0.9, 0.99):
        assert window_size(alpha, 8, proportional, rows=1, tokens=1) == 0
        assert window_size(alpha, 8, proportional, rows=4, tokens=4) == 0


def test_a_compute_bound_step_pays_only_for_likely_drafts() -> None:
    assert window_size(0.3, 4, two_cpu_cores, rows=1, tokens=1) == 0
    assert window_size(0.8, 4, two_cpu_cores, rows=1, tokens=1) in (1, 2)
    assert window_size(0.97, 4, two_cpu_cores, rows=1, tokens=1) == 4
    # beside three other slots the fixed part of the step is already shared
    assert window_size(0.8, 4, two_cpu_cores, rows=4, tokens=4) == 0


def test_a_cpu_window_must_promise_a_clear_gain() -> None:
    # beside three other slots, drafts kept 97% of the time promise a few percent on two
    # cores, less than the cores' step times wander: no window there
    assert window_size(0.97, 4, two_cpu_cores, rows=4, tokens=4) == 3
    assert window_size(0.97, 4, two_cpu_cores, rows=4, tokens=4, margin=CPU_MARGIN) == 0
    # alone the same drafts promise far more, and open one
    assert window_size(0.97, 4, two_cpu_cores, rows=1, tokens=1, margin=CPU_MARGIN) == 4


def h200(rows: int) -> float:  # the default model there, measured: one kernel path up to 8 rows
    return 0.00112 + 0.0001 * (rows - 1) if rows <= 8 else 0.0032 + 0.00003 * (rows - 9)


def test_rows_past_the_drafts_pay_only_to_keep_the_shape() -> None:
    # filler rows keep nothing: with a change of shape free they are never asked for
    for costs in (free, two_cpu_cores, h200):
        assert window_size(0.9, 7, costs, rows=1, tokens=1, drafts=2) <= 2
    for costs in (two_cpu_cores, h200):  # (rows that cost nothing may as well stay)
        assert window_size(0.9, 7, costs, rows=1, tokens=1, drafts=0, was=7) == 0
    # when the shape costs 1 ms to change, a slot that had 7 rows keeps them
    assert window_size(0.9, 7, h200, rows=1, tokens=1, drafts=0, was=7, switch=0.001) == 7
    assert window_size(0.9, 7, h200, rows=1, tokens=1, drafts=3, was=7, switch=0.001) == 7
    # and one without a window opens it only where the drafts pay for the change too
    assert window_size(0.5, 7, h200, rows=1, tokens=1, drafts=1, switch=0.001) == 0
    assert window_size(0.9, 7, h200, rows=1, tokens=1, drafts=7, switch=0.001) == 7


def test_the_incumbent_size_wins_near_ties() -> None:
    # sizes 3 and 4 promise nearly the same: the one the slot had stays
    flat = window_size(0.9, 4, free, rows=1, tokens=1, was=3)
    assert flat == 4  # free rows: 4 keeps clearly more than 3
    near = window_size(0.2, 4, free, rows=1, tokens=1, was=3)
    assert near == 3  # alpha 0.2: a fourth draft adds 0.2**4 = 0.0016 of a token


@pytest.mark.parametrize(
    ("rows", "parts"),
    [
        ([(0, 1), (1, 1), (2, 1), (3, 1)], 1),  # plain rows of consecutive sequences
        ([(0, 8), (1, 8), (2, 8), (3, 8)], 1),  # equal windows
        ([(0, 8), (1, 1), (2, 1), (3, 1)], 2),  # one window: a row of each, then its other 7
        ([(0, 8), (1, 8), (2, 1), (3, 8)], 3),  # then sequences 0-1, then 3 alone
        ([(0, 1), (1, 1), (3, 1)], 2),  # a gap splits even plain rows
        ([(0, 3), (1, 5)], 2),
        ([(2, 1)], 1),
        ([], 0),
    ],
)
def test_micro_batches_follow_llama_cpps_equal_split(rows: list[tuple[int, int]], parts: int) -> None:
    assert micro_batches(rows) == parts


def test_uniform_windows_pay_for_every_slots_rows() -> None:
    # four slots on the H200 curve: 4 rows 1.4 ms, 32 rows ~3.9 ms. One slot copying alone
    # does not pay for 28 rows; four slots copying do.
    one = [(0.8, 7), (0.5, 0), (0.5, 0), (0.5, 0)]
    assert uniform_window(one, 7, h200, rows=4, tokens=4) == 0
    four = [(0.8, 7)] * 4
    assert uniform_window(four, 7, h200, rows=4, tokens=4) == 7
    # with one slot it is the per-slot choice
    for alpha, drafts in ((0.9, 7), (0.5, 2), (0.2, 7)):
        assert uniform_window([(alpha, drafts)], 7, h200, 1, 1) == window_size(alpha, 7, h200, 1, 1, drafts)
    # the incumbent keeps its place when another size changes the shape for little
    assert uniform_window(four, 7, h200, rows=4, tokens=4, was=6, switch=0.002) == 6
    assert uniform_window([(0.3, 1)] * 4, 7, two_cpu_cores, rows=4, tokens=4) == 0


def run_guard(guard: WindowGuard, n: int, steps: int, on_rate: float, off_rate: float) -> list[bool]:
    """Steps of ``n`` slots, each emitting 4 tokens at the arm's rate (tokens/s); the arms used."""
    arms = []
    for _ in range(steps):
        on = guard.allows(n)
        arms.append(on)
        guard.add(n, 4, 4 / (on_rate if on else off_rate))
    return arms


def test_the_guard_shuts_windows_that_realise_less() -> None:
    guard = WindowGuard()
    arms = run_guard(guard, 4, 4000, on_rate=1000.0, off_rate=2000.0)  # windows halve the rate
    trial = WindowGuard.TRIAL
    assert arms[:trial] == [True] * trial  # the cost model proposes first
    assert not any(arms[trial : 2 * trial])  # then plain steps are measured
    late = arms[2000:]
    assert sum(late) / len(late) < 0.02  # only trials, ever rarer
    # the rate realised over the whole run stays within 2% of plain steps' despite the trials
    secs = sum(4 / (1000.0 if on else 2000.0) for on in arms)
    assert 4 * len(arms) / secs > 0.98 * 2000.0


def test_the_guard_keeps_windows_that_realise_more() -> None:
    guard = WindowGuard()
    arms = run_guard(guard, 1, 4000, on_rate=2000.0, off_rate=1000.0)
    late = arms[2000:]
    assert sum(late) / len(late) > 0.96


def test_the_guard_follows_a_change_and_keeps_slot_counts_apart() -> None:
    guard = WindowGuard()
    run_guard(guard, 4, 2000, on_rate=1000.0, off_rate=2000.0)
    assert not guard.allows(4)
    assert guard.allows(1)  # another slot count starts afresh
    # the workload changes: windows now pay at four slots, and the guard lets them back in
    arms = run_guard(guard, 4, 4000, on_rate=3000.0, off_rate=2000.0)
    assert sum(arms[-1000:]) / 1000 > 0.9


def test_calibration_measures_how_much_of_a_promise_windows_keep() -> None:
    cal = Calibration(decay=1.0)
    assert cal.ratio == 1.0
    for _ in range(99):
        cal.add(2, 3.0)  # windows keep two thirds of what they promise
    assert cal.ratio == pytest.approx((1 + 99 * 2) / (1 + 99 * 3))


def test_distrusted_promises_open_fewer_windows() -> None:
    # two CPU cores, four slots decoding: a window pays only if nearly all of it is kept
    assert window_size(0.99, 4, two_cpu_cores, rows=4, tokens=4) == 4
    assert window_size(0.99, 4, two_cpu_cores, rows=4, tokens=4, trust=0.9) == 0
    # one slot: the window shrinks
    assert window_size(0.95, 4, two_cpu_cores, rows=1, tokens=1) == 4
    assert window_size(0.95, 4, two_cpu_cores, rows=1, tokens=1, trust=0.8) == 3


def test_a_window_must_beat_the_windows_before_it() -> None:
    # the step already holds a long window expected to keep most of it
    alone = window_size(0.7, 4, two_cpu_cores, rows=1, tokens=1)
    after = window_size(0.7, 4, two_cpu_cores, rows=6, tokens=4.5)
    assert alone > 0 and after < alone


def measure(cost: StepCost, rows: int, seconds: float, first: float | None = None) -> None:
    """A row count's first step (set-up, not counted), then a step of ``seconds``."""
    cost.add(rows, seconds if first is None else first)
    cost.add(rows, seconds)


def test_step_cost_knows_nothing_from_one_row_count() -> None:
    cost = StepCost()
    assert cost.seconds(1) == cost.seconds(9) == 1.0
    measure(cost, 1, 0.012)
    assert cost.seconds(1) == cost.seconds(9) == 1.0


def test_step_cost_leaves_out_each_row_counts_first_step() -> None:
    cost = StepCost()
    measure(cost, 1, 0.010, first=0.5)  # a first CUDA graph capture, say
    measure(cost, 5, 0.012, first=0.9)
    assert cost.seconds(1) == pytest.approx(0.010) and cost.seconds(5) == pytest.approx(0.012)


def test_one_slow_step_at_most_doubles_an_average() -> None:
    cost = StepCost(decay=0.5)
    measure(cost, 1, 0.010)
    measure(cost, 2, 0.011)
    cost.add(2, 1.0)  # the machine hiccuped
    assert cost.seconds(2) == pytest.approx(0.5 * 0.011 + 0.5 * 0.022)


def test_step_cost_reads_between_and_beyond_what_it_measured() -> None:
    cost = StepCost()
    measure(cost, 1, 0.010)
    measure(cost, 3, 0.014)
    measure(cost, 5, 0.030)
    assert cost.seconds(2) == pytest.approx(0.012)
    assert cost.seconds(4) == pytest.approx(0.022)
    assert cost.seconds(9) == pytest.approx(0.030 + 0.005 * 4)


def test_step_cost_never_falls_with_more_rows() -> None:
    cost = StepCost()
    measure(cost, 1, 0.010)
    measure(cost, 2, 0.008)  # noise
    # out of order: both are priced at their mean, weighted alike (one step each)
    assert cost.seconds(1) == cost.seconds(2) == pytest.approx((0.99 * 0.010 + 0.008) / 1.99)
    # 3 and 2 pool to 2.25 (weight 4), 4 and 0 to 2 (weight 2), then those two to 13/6
    assert isotonic([1.0, 3.0, 2.0, 4.0, 0.0], [1, 1, 3, 1, 1]) == pytest.approx([1.0] + [13 / 6] * 4)


def test_a_row_count_measured_often_is_not_lifted_by_one_measured_rarely() -> None:
    # two cores: a few three-row steps in a slow minute, then four-slot steps all along
    cost = StepCost()
    measure(cost, 1, 0.0074)
    measure(cost, 3, 0.038)
    for _ in range(200):
        cost.add(4, 0.026)
    cost.add(11, 0.0716)
    cost.add(11, 0.0716)
    assert cost.seconds(4) == pytest.approx(0.026, rel=0.01)
    assert cost.seconds(3) <= cost.seconds(4)
    # so a window of seven rows beside four plain ones costs what it measured: 2.75 steps
    assert cost.seconds(11) / cost.seconds(4) == pytest.approx(0.0716 / 0.026, rel=0.01)


def test_step_cost_follows_a_changing_machine() -> None:
    cost = StepCost(decay=0.5)
    measure(cost, 1, 0.010)
    measure(cost, 3, 0.030)
    for _ in range(30):  # the same steps get cheap per row
        cost.add(1, 0.010)
        cost.add(3, 0.0102)
    assert cost.seconds(3) < 0.0103


def test_a_change_of_shape_is_priced_not_averaged_in() -> None:
    cost = StepCost(decay=0.5)
    measure(cost, 1, 0.0011)
    measure(cost, 8, 0.0018)
    assert cost.switch == 0.0
    cost.add(8, 0.0030, steady=False)  # run without its captured graph
    cost.add(1, 0.0023, steady=False)
    assert cost.seconds(8) == pytest.approx(0.0018) and cost.seconds(1) == pytest.approx(0.0011)
    # the average excess (0.5 * 1.2 + 0.5 * 1.2 ms) times the two steps a change slows
    assert cost.switch == pytest.approx(2 * 0.0012)


def test_a_step_faster_than_usual_after_a_change_prices_nothing() -> None:
    cost = StepCost()
    measure(cost, 1, 0.012)
    measure(cost, 5, 0.040)
    cost.add(5, 0.035, steady=False)  # a CPU: no graphs, only noise
    assert cost.switch == 0.0


def test_acceptance_counts_the_first_miss_and_forgets_slowly() -> None:
    acc = Acceptance()
    assert acc.alpha == 0.5
    for _ in range(20):
        acc.observe(offered=4, kept=4)
    assert acc.alpha > 0.95
    for _ in range(20):
        acc.observe(offered=4, kept=0)
    assert acc.alpha < 0.2
    fresh = Acceptance(part=0.0, whole=0.0, decay=1.0)
    fresh.observe(offered=4, kept=2)  # kept, kept, missed; the fourth was never tested
    assert fresh.alpha == pytest.approx(2 / 3)


def test_shadow_waits_for_the_stream_then_scores() -> None:
    sh = Shadow(start=3, tokens=[7, 8, 9])
    assert sh.check([1, 2, 3]) is None
    assert sh.check([1, 2, 3, 7, 8]) is None  # all kept so far, and two of three seen
    assert sh.check([1, 2, 3, 7, 8, 9]) == 3
    assert sh.check([1, 2, 3, 7, 5]) == 1  # a miss ends the run at once
    assert sh.check([1, 2, 3, 4]) == 0


def test_config_reaches_the_engine_command() -> None:
    from strata_core.client.reader import engine_command
    from strata_core.engine.__main__ import parse_args
    from strata_core.ops.config import load_config

    cfg = load_config(None, env={"STRATA_SPECULATIVE_ADAPTIVE": "false", "STRATA_ENGINE_PROMPT_CACHE_MIB": "64"})
    assert (cfg.speculative.adaptive, cfg.engine.prompt_cache_mib) == (False, 64)
    common = dict(site="", env={}, n_ctx=64, parallel=1, n_batch=16, threads=None, n_gpu_layers=0, flash_attn=None, backend="cpu")
    fixed = engine_command("m.gguf", spec_adaptive=False, prompt_cache_mib=64, **common).argv  # type: ignore[arg-type]
    args = parse_args(list(fixed[3:]))
    assert args.spec_fixed and args.prompt_cache_mib == 64
    default = parse_args(list(engine_command("m.gguf", **common).argv[3:]))  # type: ignore[arg-type]
    assert not default.spec_fixed and default.prompt_cache_mib == 256

def test_uniform_window_takes_the_best_rate_over_mixed_offers() -> None:
    # A window of w rows is expected to keep expected_kept(alpha, min(w, drafts)) of each
    # slot's drafts; the size chosen has the best rate, the incumbent keeping its place
    # within MARGIN. Checked against that rule written out, on random offers.
    rng = random.Random(7)
    for _ in range(300):
        offers = [(rng.choice([0.0, 1.0, rng.random()]), rng.randint(0, 9)) for _ in range(rng.randint(1, 16))]
        k, rows, was = rng.randint(0, 7), rng.randint(1, 16), rng.randint(0, 7)

        def rate(w: int, offers: list[tuple[float, int]] = offers, rows: int = rows, was: int = was) -> float:
            kept = sum(expected_kept(a, min(w, d)) for a, d in offers)
            return (rows + 0.9 * kept) / (h200(rows + len(offers) * w) + (0.0 if w == was else 0.001))

        want = was if was <= k else 0
        best = MARGIN * rate(want)
        for w in range(k + 1):
            if w != want and rate(w) > best:
                want, best = w, rate(w)
        assert uniform_window(offers, k, h200, rows, float(rows), was, 0.001, 0.9) == want, offers
