"""Adaptive bit widths for halo messages: AdaQP's variance-time problem (adaqp-mlsys23 §3.3, §4.2).

A *message* is the embedding (or gradient) of a remote node k that one device sends to another
in a communication round. Quantizing it stochastically to b bits adds ``beta_k / (2^b - 1)^2`` to
the target's weight-gradient variance, where ``beta_k = sum_{v in N_T(k)} alpha_{k,v}^2 * D_k *
(max h_k - min h_k)^2 / 6`` (Theorem 1 and eq. 9, summed in eq. 11), and sending it costs time on
its device pair i by the linear model ``theta_i * bits + gamma_i`` (eq. 10). AdaQP sorts a pair's
messages by beta and cuts them into groups that share one width (§4.2; appendix B uses 100-2000
messages a group), then scalarises the two objectives by a weighted sum (eq. 12)::

    min  lam * sum_g beta_g / (2^b_g - 1)^2 / V_ref  +  (1 - lam) * Z / T_ref
    s.t. theta_i * sum_{g in pair i} D_g * b_g + gamma_i <= Z   for every pair i that sends

with ``beta_g`` the sum of group g's betas and ``D_g`` its number of values. It is solved as a
mixed integer linear program (binary ``x[g, b]``, one width per group; continuous ``Z >= 0``) by
HiGHS through ``scipy.optimize.milp``. The paper leaves the two terms in their own units; here
each is divided by a reference (see ``reference_scales``) so that lam weighs comparable numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp, nnls

DEFAULT_CANDIDATES: tuple[int, ...] = (2, 4, 8)
MAX_CANDIDATE_BITS = 32

# Slack on lam = 0's time bound, relative to T_ref: the bound is the exact minimum, so
# rounding in the solver must not make it infeasible.
_TIME_BOUND_SLACK = 1e-9


# ------------------------------------------------------------------ messages and groups


def variance_proxy(
    agg_coef_sq_sum: torch.Tensor,
    dim: int | torch.Tensor,
    row_min: torch.Tensor,
    row_max: torch.Tensor,
) -> torch.Tensor:
    """beta_k of eq. 11 for a batch of messages, one per remote node k, sent to one target device.

    ``beta_k = agg_coef_sq_sum[k] * dim[k] * (row_max[k] - row_min[k])^2 / 6``: the variance that
    quantizing message k adds at one quantization level (2^b - 1 = 1); at b bits it is
    ``beta_k / (2^b - 1)^2``. ``agg_coef_sq_sum[k]`` is the sum of alpha_{k,v}^2 over k's
    neighbours v on the target device; ``dim`` is D_k (one int for all, or one per message).
    The result is float64 on the inputs' device, so that sums over large groups keep precision.
    """
    coef = torch.as_tensor(agg_coef_sq_sum)
    lo = torch.as_tensor(row_min, device=coef.device)
    hi = torch.as_tensor(row_max, device=coef.device)
    d = torch.as_tensor(dim, device=coef.device)
    for name, t in (("agg_coef_sq_sum", coef), ("row_min", lo), ("row_max", hi)):
        if t.dim() != 1:
            raise ValueError(
                f"{name} must be a 1-D tensor (one value per message), got shape {tuple(t.shape)}"
            )
    n = coef.shape[0]
    if lo.shape[0] != n or hi.shape[0] != n:
        raise ValueError(
            "agg_coef_sq_sum, row_min and row_max must have one value per message each, "
            f"got lengths {n}, {lo.shape[0]}, {hi.shape[0]}"
        )
    if d.dim() > 1 or (d.dim() == 1 and d.shape[0] != n):
        raise ValueError(
            f"dim must be one int or a 1-D tensor of length {n}, got shape {tuple(d.shape)}"
        )
    coef, lo, hi, d = (t.to(torch.float64) for t in (coef, lo, hi, d))
    for name, t in (("agg_coef_sq_sum", coef), ("dim", d), ("row_min", lo), ("row_max", hi)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite, got a NaN or infinite value")
    if bool((coef < 0).any()):
        raise ValueError("agg_coef_sq_sum must be >= 0 (a sum of squared coefficients)")
    if bool((d < 0).any()):
        raise ValueError("dim must be >= 0")
    if bool((hi < lo).any()):
        raise ValueError("row_max must be >= row_min for every message (were they swapped?)")
    return coef * d * (hi - lo).square() / 6.0


def group_messages(beta: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort one device pair's messages by beta, largest first, and cut them into groups (§4.2).

    Messages in a group share one bit width, which keeps the MILP small. Returns
    ``(order, group_ids)``: ``order`` lists message indices by decreasing beta (ties keep index
    order), so ``order[g * group_size:(g + 1) * group_size]`` are group g's messages, contiguous
    as a sending buffer wants them; ``group_ids[m]`` is message m's group, so ``bits[group_ids]``
    gives every message its width. There are ``ceil(n / group_size)`` groups; only the last,
    holding the smallest betas, may be shorter.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    beta = torch.as_tensor(beta)
    if beta.dim() != 1:
        raise ValueError(
            f"beta must be a 1-D tensor (one value per message), got shape {tuple(beta.shape)}"
        )
    if not bool(torch.isfinite(beta).all()):
        raise ValueError("beta must be finite, got a NaN or infinite value")
    order = torch.sort(beta, descending=True, stable=True).indices
    group_ids = torch.empty_like(order)
    group_ids[order] = torch.arange(order.numel(), device=order.device) // group_size
    return order, group_ids


def group_sums(
    values: torch.Tensor, group_ids: torch.Tensor, num_groups: int | None = None
) -> torch.Tensor:
    """Sum per-message values over groups: beta_g from the betas, D_g from the value counts.

    ``num_groups`` defaults to ``max(group_ids) + 1`` (0 for no messages).
    """
    values = torch.as_tensor(values)
    group_ids = torch.as_tensor(group_ids, device=values.device)
    if values.shape != group_ids.shape or values.dim() != 1:
        raise ValueError(
            "values and group_ids must be 1-D and of the same length, "
            f"got shapes {tuple(values.shape)} and {tuple(group_ids.shape)}"
        )
    if num_groups is None:
        num_groups = int(group_ids.max()) + 1 if group_ids.numel() else 0
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.index_add_(0, group_ids.long(), values)


# ------------------------------------------------------------------ cost model


def fit_cost_model(bits_sent: ArrayLike, seconds: ArrayLike) -> tuple[float, float]:
    """Fit eq. 10's cost model ``seconds = theta * bits + gamma`` to measured transfers.

    Least squares with ``theta >= 0`` and ``gamma >= 0`` (a transfer never gets faster with more
    bits and never takes negative time), by ``scipy.optimize.nnls`` on the bit counts scaled to
    at most 1 (so the two columns are of one magnitude); noiseless data is recovered exactly.
    With one sample, or when every sample sent the same number of bits, slope and intercept
    cannot be told apart: the line then goes through the origin (``theta = mean(seconds) /
    bits``, ``gamma = 0``) so that fewer bits still predict less time; if that count is 0,
    ``theta = 0`` and ``gamma = mean(seconds)``. Returns ``(theta, gamma)`` in seconds per bit
    and seconds.
    """
    b = np.asarray(bits_sent, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if b.ndim != 1 or t.ndim != 1 or b.shape != t.shape:
        raise ValueError(
            "bits_sent and seconds must be 1-D and of the same length, "
            f"got shapes {b.shape} and {t.shape}"
        )
    if b.size == 0:
        raise ValueError("fit_cost_model needs at least one measured transfer, got none")
    for name, x in (("bits_sent", b), ("seconds", t)):
        if not np.isfinite(x).all() or (x < 0).any():
            raise ValueError(f"{name} must be finite and >= 0")
    top = float(b.max())
    if top == 0.0:
        return 0.0, float(t.mean())
    if float(np.ptp(b)) <= 1e-12 * top:
        return float(t.mean()) / float(b.mean()), 0.0
    design = np.column_stack([b / top, np.ones_like(b)])
    (slope, gamma), _ = nnls(design, t)
    return float(slope) / top, float(gamma)


# ------------------------------------------------------------------ the problem (eq. 12)


def _vector(name: str, x: ArrayLike, *, minimum: float | None = 0.0) -> np.ndarray:
    """A read-only finite float64 vector, >= minimum."""
    arr = np.array(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite, got a NaN or infinite value")
    if minimum is not None and (arr < minimum).any():
        raise ValueError(f"{name} must be >= {minimum:g}, got {float(arr.min())!r}")
    arr.flags.writeable = False
    return arr


def _candidates(candidates: Sequence[int]) -> tuple[int, ...]:
    """Distinct bit widths, ascending."""
    allowed = f"a non-empty set of distinct integers from 1 to {MAX_CANDIDATE_BITS}"
    try:
        items = tuple(candidates)
    except TypeError:
        raise ValueError(f"candidates must be {allowed}, got {candidates!r}") from None
    if (
        not items
        or len(set(items)) != len(items)
        or not all(isinstance(b, int | np.integer) and not isinstance(b, bool) for b in items)
        or not all(1 <= b <= MAX_CANDIDATE_BITS for b in items)
    ):
        raise ValueError(f"candidates must be {allowed}, got {candidates!r}")
    return tuple(sorted(int(b) for b in items))


@dataclass(frozen=True, eq=False)
class AssignmentProblem:
    """Eq. 12's data for one communication round of one layer's pass, one entry per group.

    ``beta[g]``: the sum of group g's message betas (``variance_proxy``); ``values[g]``: D_g, the
    number of values it sends (messages x dim); ``pair[g]``: its device pair, an index into
    ``theta`` / ``gamma``, pair i's cost model (seconds per bit, seconds; ``fit_cost_model``);
    ``lam``: the weight of the variance term, in [0, 1]; ``candidates``: the widths a group may
    take. Arrays are copied read-only and checked here, so a bad problem never reaches the solver.
    """

    beta: np.ndarray
    values: np.ndarray
    pair: np.ndarray
    theta: np.ndarray
    gamma: np.ndarray
    lam: float = 0.5
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES

    def __post_init__(self) -> None:
        beta = _vector("beta", self.beta)
        values = _vector("values", self.values)
        theta = _vector("theta", self.theta)
        gamma = _vector("gamma", self.gamma)
        pair = np.array(self.pair)
        if pair.size == 0:
            pair = pair.astype(np.int64)
        if pair.ndim != 1 or not np.issubdtype(pair.dtype, np.integer):
            raise ValueError(f"pair must be a 1-D integer array, got {pair.dtype} {pair.shape}")
        pair = pair.astype(np.int64)
        pair.flags.writeable = False
        if not (beta.shape == values.shape == pair.shape):
            raise ValueError(
                "beta, values and pair must have one entry per group each, "
                f"got lengths {beta.size}, {values.size}, {pair.size}"
            )
        if theta.shape != gamma.shape:
            raise ValueError(
                "theta and gamma must have one entry per device pair each, "
                f"got lengths {theta.size} and {gamma.size}"
            )
        if pair.size and (pair.min() < 0 or pair.max() >= theta.size):
            raise ValueError(
                f"pair must index theta / gamma (0 to {theta.size - 1}), "
                f"got values from {int(pair.min())} to {int(pair.max())}"
            )
        lam = self.lam
        if isinstance(lam, bool) or not isinstance(lam, int | float | np.floating):
            raise ValueError(f"lam must be a number in [0, 1], got {lam!r}")
        if not 0.0 <= float(lam) <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam!r}")
        for name, value in (
            ("beta", beta),
            ("values", values),
            ("pair", pair),
            ("theta", theta),
            ("gamma", gamma),
            ("lam", float(lam)),
            ("candidates", _candidates(self.candidates)),
        ):
            object.__setattr__(self, name, value)

    @property
    def num_groups(self) -> int:
        return int(self.beta.size)


@dataclass(frozen=True, eq=False)
class Assignment:
    """A solution: ``bits[g]`` for every group, its predicted variance (eq. 11's sum) and max
    pair time (eq. 10's max, seconds), and the wall time spent finding it, in seconds.

    ``optimal`` is False only when the solver stopped at ``time_limit`` with a feasible but
    unproven assignment.
    """

    bits: np.ndarray
    variance: float
    max_time: float
    solve_seconds: float
    optimal: bool = True


def predict(problem: AssignmentProblem, bits: ArrayLike) -> tuple[float, float]:
    """``(variance, max_time)`` of an assignment: eq. 11's sum and eq. 10's max over the pairs
    that send at least one group (a pair with nothing to send takes no time)."""
    b = np.asarray(bits, dtype=np.float64)
    if b.shape != problem.beta.shape:
        raise ValueError(
            f"bits must have one width per group ({problem.num_groups}), got {b.shape}"
        )
    if problem.num_groups == 0:
        return 0.0, 0.0
    variance = float(np.sum(problem.beta / (2.0**b - 1.0) ** 2))
    n_pairs = problem.theta.size
    sent = np.bincount(problem.pair, weights=problem.values * b, minlength=n_pairs)
    sends = np.bincount(problem.pair, minlength=n_pairs) > 0
    times = problem.theta * sent + problem.gamma
    return variance, float(times[sends].max())


def reference_scales(problem: AssignmentProblem) -> tuple[float, float]:
    """``(V_ref, T_ref)``, the units the two terms of eq. 12 are measured in.

    V_ref is the variance with every group at the smallest width (the largest it can be) and
    T_ref the max pair time with every group at the largest width (the longest it can be), so
    both scaled terms lie in [0, 1] and lam weighs fractions of the worst case. A reference that
    is 0 (all betas 0, or nothing costs time) becomes 1: its term is then constant.
    """
    v_ref, _ = predict(problem, np.full(problem.num_groups, problem.candidates[0]))
    _, t_ref = predict(problem, np.full(problem.num_groups, problem.candidates[-1]))
    return (v_ref if v_ref > 0 else 1.0), (t_ref if t_ref > 0 else 1.0)


def scaled_objective(problem: AssignmentProblem, bits: ArrayLike) -> float:
    """Eq. 12's objective as ``assign_bits`` minimises it: ``lam * V / V_ref + (1 - lam) * T / T_ref``."""
    variance, max_time = predict(problem, bits)
    v_ref, t_ref = reference_scales(problem)
    return problem.lam * variance / v_ref + (1.0 - problem.lam) * max_time / t_ref


def assign_bits(
    problem: AssignmentProblem, *, mip_rel_gap: float = 1e-3, time_limit: float | None = None
) -> Assignment:
    """Choose a width per group by eq. 12, solved as a MILP with HiGHS (``scipy.optimize.milp``).

    Minimises ``lam * V / V_ref + (1 - lam) * Z / T_ref`` (``reference_scales``: V_ref is the
    variance at the smallest width everywhere, T_ref the max pair time at the largest width
    everywhere), with binary ``x[g, b]``, ``sum_b x[g, b] = 1``, and ``Z >= 0`` bounding every
    sending pair's predicted time. The two ends are exact rather than left to ties:
    ``lam = 1`` gives every group the largest width (no solver call), and ``lam = 0`` gives the
    minimum max pair time (every group at the smallest width on the slowest pair) and, among
    such assignments, the least variance (within ``mip_rel_gap``), so the other pairs use their
    slack for precision.
    No groups means nothing to send: an empty assignment, no solver call, ``solve_seconds`` 0.

    ``solve_seconds`` is the ``time.perf_counter`` wall time of building and solving the model.
    ``mip_rel_gap``: stop once the scaled objective is proven within this fraction of the
    optimum. Groups of similar size make many near-equal assignments that branch-and-bound must
    rule out: on 8 pairs x 200 groups (2 busy cores) 1e-3 took 0.4 s, 1e-4 19 s, and 1e-6 was
    still searching after 30 s, for objectives that differ by 0.06 %. ``time_limit`` (seconds)
    stops the search with the best assignment found so far, reported with ``optimal=False``
    (the best single width for every group if it has found none yet).
    HiGHS may print debugging lines to the process's standard output (file descriptor 1) on
    long searches; callers that promise clean stdout must redirect it around this call.
    """
    if not (0.0 <= mip_rel_gap < 1.0):
        raise ValueError(f"mip_rel_gap must be in [0, 1), got {mip_rel_gap!r}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds or None, got {time_limit!r}")
    n_groups = problem.num_groups
    if n_groups == 0:
        return Assignment(np.zeros(0, dtype=np.int64), 0.0, 0.0, 0.0)
    start = time.perf_counter()
    widths = np.array(problem.candidates, dtype=np.int64)
    if problem.lam == 1.0 or widths.size == 1:
        bits, optimal = np.full(n_groups, widths[-1]), True
    else:
        bits, optimal = _solve(problem, widths, mip_rel_gap, time_limit)
    solve_seconds = time.perf_counter() - start
    variance, max_time = predict(problem, bits)
    bits.flags.writeable = False
    return Assignment(bits, variance, max_time, solve_seconds, optimal)


def _solve(
    problem: AssignmentProblem,
    widths: np.ndarray,
    mip_rel_gap: float,
    time_limit: float | None,
) -> tuple[np.ndarray, bool]:
    """Build and solve the MILP; variables are x[g, b] row-major, then z = Z / T_ref."""
    n_groups, n_widths = problem.num_groups, widths.size
    n_x = n_groups * n_widths
    v_ref, t_ref = reference_scales(problem)
    if problem.lam == 0.0:
        # Lexicographic: the least variance among the minimum-max-time assignments, whose max
        # time is that of the smallest width everywhere (time grows with every width).
        _, z_min = predict(problem, np.full(n_groups, widths[0]))
        w_var, w_time = 1.0, 0.0
        z_max = z_min / t_ref * (1.0 + _TIME_BOUND_SLACK) + _TIME_BOUND_SLACK
    else:
        w_var, w_time, z_max = problem.lam, 1.0 - problem.lam, math.inf

    levels = (2.0 ** widths.astype(np.float64) - 1.0) ** 2
    var_cost = np.outer(problem.beta / v_ref, 1.0 / levels)
    c = np.append(w_var * var_cost.ravel(), w_time)

    x_cols = np.arange(n_x)
    group_rows = np.repeat(np.arange(n_groups), n_widths)
    one_width = sparse.csr_array((np.ones(n_x), (group_rows, x_cols)), shape=(n_groups, n_x + 1))

    senders = np.unique(problem.pair)  # pairs with at least one group
    row_of_pair = np.full(problem.theta.size, -1, dtype=np.int64)
    row_of_pair[senders] = np.arange(senders.size)
    time_cost = np.outer(problem.theta[problem.pair] * problem.values / t_ref, widths)
    pair_time = sparse.csr_array(
        (
            np.concatenate([time_cost.ravel(), -np.ones(senders.size)]),
            (
                np.concatenate(
                    [np.repeat(row_of_pair[problem.pair], n_widths), np.arange(senders.size)]
                ),
                np.concatenate([x_cols, np.full(senders.size, n_x)]),
            ),
        ),
        shape=(senders.size, n_x + 1),
    )
    constraints = [
        LinearConstraint(one_width, 1.0, 1.0),
        LinearConstraint(pair_time, -np.inf, -problem.gamma[senders] / t_ref),
    ]
    # HiGHS's presolve finds nothing to remove in this model (one choice row per group, one
    # time row per pair) and took half the solve: the 12 problems of a 4-worker arxiv run
    # (1,126-1,132 groups each, dumped from the run) took 1.50 s with it and 0.69 s without,
    # one after the other on one thread, for the same objectives within mip_rel_gap
    options: dict[str, float | bool] = {"mip_rel_gap": mip_rel_gap, "presolve": False}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    result = milp(
        c,
        integrality=np.append(np.ones(n_x), 0.0),
        bounds=Bounds(np.zeros(n_x + 1), np.append(np.ones(n_x), z_max)),
        constraints=constraints,
        options=options,
    )
    if result.x is None:
        if result.status != 1:  # 1: the time limit, before any assignment was found
            raise RuntimeError(f"HiGHS found no bit-width assignment: {result.message}")
        return _best_uniform(problem, widths), False
    chosen = np.argmax(result.x[:n_x].reshape(n_groups, n_widths), axis=1)
    return widths[chosen], bool(result.status == 0)


def _best_uniform(problem: AssignmentProblem, widths: np.ndarray) -> np.ndarray:
    """The best one-width-for-all assignment: what a time limit that found nothing gets.

    Every assignment is feasible for lam > 0 (Z is free), and for lam = 0 the smallest
    width everywhere is the optimum's max time, so this is always a valid answer.
    """
    if problem.lam == 0.0:
        return np.full(problem.num_groups, widths[0])
    scores = [scaled_objective(problem, np.full(problem.num_groups, w)) for w in widths]
    return np.full(problem.num_groups, widths[int(np.argmin(scores))])
