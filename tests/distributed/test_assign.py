"""AdaQP's bit-width assigner: the MILP against brute force, its ends, the proxy, groups, cost fit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from qtrain.distributed.assign import (
    Assignment,
    AssignmentProblem,
    assign_bits,
    fit_cost_model,
    group_messages,
    group_sums,
    predict,
    reference_scales,
    scaled_objective,
    variance_proxy,
)

WIDTHS = (2, 4, 8)


def random_problem(
    seed: int, n_pairs: int = 2, per_pair: int = 3, lam: float = 0.5, **overrides: object
) -> AssignmentProblem:
    """Groups of one layer's round: betas over two decades, pairs of different speed."""
    rng = np.random.default_rng(seed)
    n = n_pairs * per_pair
    fields: dict[str, object] = {
        "beta": rng.uniform(0.0, 2.0, n) * 10.0 ** rng.integers(-1, 2, n),
        "values": rng.integers(1, 50, n) * 16.0,
        "pair": np.repeat(np.arange(n_pairs), per_pair),
        "theta": rng.uniform(1e-9, 4e-9, n_pairs),
        "gamma": rng.uniform(0.0, 2e-6, n_pairs),
        "lam": lam,
        "candidates": WIDTHS,
    }
    fields.update(overrides)
    return AssignmentProblem(**fields)  # type: ignore[arg-type]


def terms(p: AssignmentProblem, bits: tuple[int, ...]) -> tuple[float, float]:
    """Eq. 11's variance and eq. 10's max pair time, written out loop by loop."""
    variance = sum(p.beta[g] / (2**b - 1) ** 2 for g, b in enumerate(bits))
    times = {}
    for g, b in enumerate(bits):
        i = int(p.pair[g])
        times[i] = times.get(i, p.gamma[i]) + p.theta[i] * p.values[g] * b
    return variance, max(times.values())


def brute_force(p: AssignmentProblem) -> list[tuple[tuple[int, ...], float, float]]:
    """Every assignment with its (variance, max time)."""
    return [
        (bits, *terms(p, bits)) for bits in itertools.product(p.candidates, repeat=p.num_groups)
    ]


def brute_objective(p: AssignmentProblem, variance: float, max_time: float) -> float:
    """The scaled eq. 12 objective, with the references computed here from their definition."""
    v_ref, _ = terms(p, (p.candidates[0],) * p.num_groups)
    _, t_ref = terms(p, (p.candidates[-1],) * p.num_groups)
    return p.lam * variance / v_ref + (1 - p.lam) * max_time / t_ref


# ------------------------------------------------------------------ the MILP


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam", [0.1, 0.5, 0.9])
def test_milp_matches_brute_force(seed: int, lam: float) -> None:
    shape = (2, 3) if seed % 2 == 0 else (3, 2)
    p = random_problem(seed, *shape, lam=lam)
    best = min(brute_objective(p, v, t) for _, v, t in brute_force(p))

    exact = assign_bits(p, mip_rel_gap=0.0)
    assert exact.optimal
    assert set(exact.bits.tolist()) <= set(WIDTHS)
    assert (exact.variance, exact.max_time) == pytest.approx(terms(p, tuple(exact.bits)), rel=1e-12)
    assert brute_objective(p, exact.variance, exact.max_time) == pytest.approx(best, rel=1e-9)
    assert scaled_objective(p, exact.bits) == pytest.approx(best, rel=1e-9)
    assert exact.solve_seconds > 0

    default = assign_bits(p)  # mip_rel_gap 1e-3
    assert brute_objective(p, default.variance, default.max_time) <= best * (1 + 1e-3) + 1e-12


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_time_limit_before_any_assignment_gives_the_best_single_width(lam: float) -> None:
    p = random_problem(0, 4, 400, lam=lam)
    a = assign_bits(p, time_limit=1e-6)  # HiGHS stops before it has found anything
    assert not a.optimal
    uniform = {w: scaled_objective(p, [w] * p.num_groups) for w in WIDTHS}
    expected = WIDTHS[0] if lam == 0.0 else min(uniform, key=uniform.__getitem__)
    assert a.bits.tolist() == [expected] * p.num_groups
    assert (a.variance, a.max_time) == pytest.approx(predict(p, a.bits))


def test_pair_without_groups_takes_no_time() -> None:
    # pair 1 has no groups: its large gamma must not bound Z
    p = AssignmentProblem(
        beta=[1.0, 2.0, 0.5],
        values=[100.0, 200.0, 50.0],
        pair=[0, 0, 2],
        theta=[1e-9, 1e-9, 2e-9],
        gamma=[0.0, 1.0, 0.0],
        lam=0.5,
    )
    _, max_time = predict(p, [8, 8, 8])
    assert max_time == pytest.approx(max(1e-9 * 300 * 8, 2e-9 * 50 * 8))
    best = min(brute_objective(p, v, t) for _, v, t in brute_force(p))
    assert scaled_objective(p, assign_bits(p, mip_rel_gap=0.0).bits) == pytest.approx(best)


@pytest.mark.parametrize("seed", range(3))
def test_lambda_one_gives_every_group_the_largest_width(seed: int) -> None:
    p = random_problem(seed, 3, 4, lam=1.0)
    a = assign_bits(p)
    assert a.bits.tolist() == [8] * 12
    assert (a.variance, a.max_time) == pytest.approx(terms(p, (8,) * 12))
    custom = assign_bits(random_problem(seed, 3, 4, lam=1.0, candidates=(3, 1, 5)))
    assert custom.bits.tolist() == [5] * 12


@pytest.mark.parametrize("seed", range(4))
def test_lambda_zero_minimises_the_max_pair_time(seed: int) -> None:
    p = random_problem(seed, 2, 3, lam=0.0)
    table = brute_force(p)
    t_min = min(t for _, _, t in table)
    a = assign_bits(p, mip_rel_gap=0.0)
    assert a.max_time == pytest.approx(t_min, rel=1e-9)
    # ... and spends the other pairs' slack on precision: the least variance at that time
    v_min = min(v for _, v, t in table if t <= t_min * (1 + 1e-9))
    assert a.variance == pytest.approx(v_min, rel=1e-9)


def test_larger_lambda_never_increases_the_variance() -> None:
    p = random_problem(7, 3, 5)
    results = [
        assign_bits(random_problem(7, 3, 5, lam=lam), mip_rel_gap=0.0)
        for lam in np.linspace(0.0, 1.0, 11)
    ]
    variances = [r.variance for r in results]
    times = [r.max_time for r in results]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(variances))
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times))
    assert variances[-1] < variances[0] and times[-1] > times[0]  # the sweep does trade off
    v_ref, t_ref = reference_scales(p)
    assert variances[0] <= v_ref and times[-1] == pytest.approx(t_ref)


def test_zero_groups_returns_an_empty_assignment_without_solving() -> None:
    p = AssignmentProblem(beta=[], values=[], pair=[], theta=[1e-9], gamma=[1e-6], lam=0.5)
    a = assign_bits(p)
    assert isinstance(a, Assignment)
    assert a.bits.shape == (0,) and a.bits.dtype == np.int64
    assert (a.variance, a.max_time, a.solve_seconds) == (0.0, 0.0, 0.0)
    none_at_all = AssignmentProblem(beta=[], values=[], pair=[], theta=[], gamma=[], lam=0.0)
    assert assign_bits(none_at_all).solve_seconds == 0.0


def test_degenerate_terms_still_solve() -> None:
    # all betas 0 (constant rows) and free transfers: both references fall back to 1
    p = random_problem(1, 2, 2, beta=np.zeros(4), theta=np.zeros(2), gamma=np.zeros(2))
    assert reference_scales(p) == (1.0, 1.0)
    a = assign_bits(p)
    assert a.variance == 0.0 and a.max_time == 0.0 and set(a.bits.tolist()) <= set(WIDTHS)


def test_problem_arrays_are_read_only_copies() -> None:
    beta = np.array([1.0, 2.0])
    p = AssignmentProblem(beta, [1.0, 1.0], [0, 0], [1e-9], [0.0], lam=0.25, candidates=[8, 2])
    beta[0] = 5.0
    assert p.beta[0] == 1.0 and not p.beta.flags.writeable
    assert p.candidates == (2, 8)
    assert not assign_bits(p).bits.flags.writeable


# ------------------------------------------------------------------ bad input


def good_fields() -> dict[str, object]:
    return {
        "beta": [1.0, 2.0],
        "values": [10.0, 20.0],
        "pair": [0, 1],
        "theta": [1e-9, 2e-9],
        "gamma": [0.0, 1e-6],
        "lam": 0.5,
        "candidates": (2, 4, 8),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lam": 1.5}, r"lam must be in \[0, 1\], got 1.5"),
        ({"lam": -0.1}, r"lam must be in \[0, 1\]"),
        ({"lam": math.nan}, r"lam must be in \[0, 1\]"),
        ({"lam": "0.5"}, r"lam must be a number in \[0, 1\]"),
        (
            {"candidates": ()},
            "candidates must be a non-empty set of distinct integers from 1 to 32",
        ),
        ({"candidates": (2, 2)}, "candidates must be .*distinct"),
        ({"candidates": (0, 4)}, "candidates must be .*from 1 to 32"),
        ({"candidates": (2.5,)}, "candidates must be .*integers"),
        ({"beta": [1.0, -2.0]}, "beta must be >= 0"),
        ({"beta": [1.0, math.inf]}, "beta must be finite"),
        (
            {"beta": [1.0]},
            "beta, values and pair must have one entry per group each, got lengths 1, 2, 2",
        ),
        ({"values": [1.0, 2.0, 3.0]}, "got lengths 2, 3, 2"),
        ({"pair": [0, 2]}, r"pair must index theta / gamma \(0 to 1\), got values from 0 to 2"),
        ({"pair": [0.0, 1.0]}, "pair must be a 1-D integer array"),
        ({"gamma": [0.0]}, "theta and gamma must have one entry per device pair each"),
        ({"theta": [-1e-9, 1e-9]}, "theta must be >= 0"),
        ({"values": [[1.0, 2.0]]}, "values must be a 1-D array"),
    ],
)
def test_bad_problem_raises_naming_the_field(change: dict[str, object], message: str) -> None:
    fields = good_fields() | change
    with pytest.raises(ValueError, match=message):
        assign_bits(AssignmentProblem(**fields))  # type: ignore[arg-type]


def test_bad_solver_settings_and_bits_raise() -> None:
    p = AssignmentProblem(**good_fields())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mip_rel_gap must be in"):
        assign_bits(p, mip_rel_gap=1.0)
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        assign_bits(p, time_limit=0)
    with pytest.raises(ValueError, match=r"bits must have one width per group \(2\)"):
        predict(p, [8])


# ------------------------------------------------------------------ variance proxy and groups


def test_variance_proxy_on_hand_computed_numbers() -> None:
    coef = torch.tensor([0.5, 2.0, 0.0])
    lo = torch.tensor([-1.0, 0.0, -3.0])
    hi = torch.tensor([1.0, 3.0, 3.0])
    # 0.5 * 4 * 2^2 / 6, 2 * 4 * 3^2 / 6, 0
    beta = variance_proxy(coef, 4, lo, hi)
    assert beta.dtype == torch.float64
    assert beta.tolist() == pytest.approx([4 / 3, 12.0, 0.0])
    per_message = variance_proxy(coef, torch.tensor([4, 8, 2]), lo, hi)
    assert per_message.tolist() == pytest.approx([4 / 3, 24.0, 0.0])
    assert variance_proxy(torch.zeros(0), 16, torch.zeros(0), torch.zeros(0)).shape == (0,)


def test_variance_proxy_is_the_quantization_variance_at_one_level() -> None:
    # Theorem 1: stochastic rounding to 2^b - 1 levels has variance D * S^2 / 6 per message at
    # most; beta / (2^b - 1)^2 is that bound times the coefficients
    lo, hi, dim, bits = torch.tensor([-2.0]), torch.tensor([1.0]), 64, 2
    scale = (hi - lo) / (2**bits - 1)
    bound = dim * scale.square() / 6
    assert variance_proxy(torch.ones(1), dim, lo, hi) / (2**bits - 1) ** 2 == pytest.approx(bound)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"coef": torch.tensor([-1.0, 1.0])}, "agg_coef_sq_sum must be >= 0"),
        ({"hi": torch.tensor([0.0, -5.0])}, "row_max must be >= row_min"),
        ({"lo": torch.zeros(3)}, "one value per message each, got lengths 2, 3, 2"),
        ({"dim": torch.tensor([1, 2, 3])}, "dim must be one int or a 1-D tensor of length 2"),
        ({"dim": -1}, "dim must be >= 0"),
        ({"coef": torch.ones(2, 1)}, "agg_coef_sq_sum must be a 1-D tensor"),
        ({"hi": torch.tensor([1.0, math.nan])}, "row_max must be finite"),
    ],
)
def test_variance_proxy_bad_input(change: dict[str, object], message: str) -> None:
    args = {"coef": torch.ones(2), "dim": 4, "lo": torch.zeros(2), "hi": torch.ones(2)} | change
    with pytest.raises(ValueError, match=message):
        variance_proxy(args["coef"], args["dim"], args["lo"], args["hi"])  # type: ignore[arg-type]


def test_group_messages_orders_by_beta_and_leaves_a_short_last_group() -> None:
    beta = torch.tensor([0.1, 5.0, 3.0, 5.0, 0.2])
    order, group_ids = group_messages(beta, 2)
    assert order.tolist() == [1, 3, 2, 4, 0]  # largest first, ties in index order
    assert group_ids.tolist() == [2, 0, 1, 0, 1]  # the last group holds one message
    assert torch.equal(group_ids[order], torch.tensor([0, 0, 1, 1, 2]))
    bits = torch.tensor([8, 4, 2])
    assert bits[group_ids].tolist() == [2, 8, 4, 8, 4]
    assert group_sums(beta, group_ids).tolist() == pytest.approx([10.0, 3.2, 0.1])
    assert group_sums(torch.full((5,), 16.0), group_ids, 4).tolist() == [32.0, 32.0, 16.0, 0.0]

    whole, ids = group_messages(beta, 10)
    assert ids.tolist() == [0] * 5 and whole.tolist() == [1, 3, 2, 4, 0]
    empty_order, empty_ids = group_messages(torch.zeros(0), 3)
    assert empty_order.numel() == 0 and empty_ids.numel() == 0
    assert group_sums(torch.zeros(0), empty_ids).numel() == 0


@pytest.mark.parametrize("size", [0, -1, 2.0, True])
def test_group_messages_bad_group_size(size: object) -> None:
    with pytest.raises(ValueError, match="group_size must be an integer >= 1"):
        group_messages(torch.ones(3), size)  # type: ignore[arg-type]


# ------------------------------------------------------------------ cost model


def test_fit_cost_model_recovers_noiseless_line() -> None:
    bits = np.array([1e6, 4e6, 2.5e7, 8e7])
    theta, gamma = fit_cost_model(bits, 2.5e-9 * bits + 3e-5)
    assert theta == pytest.approx(2.5e-9, rel=1e-9)
    assert gamma == pytest.approx(3e-5, rel=1e-9)
    # a flat or falling fit keeps theta >= 0 (the mean time), a negative intercept gamma >= 0
    assert fit_cost_model([1e6, 2e6, 3e6], [3e-3, 2e-3, 1e-3]) == pytest.approx((0.0, 2e-3))
    theta, gamma = fit_cost_model([1e6, 2e6, 3e6], [0.0, 1e-3, 2e-3])
    assert theta >= 0 and gamma == 0.0


def test_fit_cost_model_with_one_sample_or_one_size_goes_through_the_origin() -> None:
    assert fit_cost_model([2e6], [4e-3]) == pytest.approx((2e-9, 0.0))
    assert fit_cost_model([2e6, 2e6, 2e6], [3e-3, 4e-3, 5e-3]) == pytest.approx((2e-9, 0.0))
    assert fit_cost_model([0, 0], [1e-5, 3e-5]) == pytest.approx((0.0, 2e-5))


@pytest.mark.parametrize(
    ("bits", "seconds", "message"),
    [
        ([], [], "at least one measured transfer"),
        ([1.0, 2.0], [1.0], "same length"),
        ([1.0, -2.0], [1.0, 1.0], "bits_sent must be finite and >= 0"),
        ([1.0, 2.0], [1.0, math.nan], "seconds must be finite and >= 0"),
    ],
)
def test_fit_cost_model_bad_input(bits: list[float], seconds: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_cost_model(bits, seconds)
