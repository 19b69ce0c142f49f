"""Search for the sparse-update plan with the largest predicted accuracy gain that fits a memory budget (TTE §2.2).
(Regression: the gains are shares of the no-update MSE removed, contribution.py; the search is the same.)

The problem (additive contribution model):
  choose k in 1..K (biases of the last k trainable layers) and, for each of those k layers, at most one weight
  ratio r in {1/8, 1/4, 1/2, 1} (or none), to
      maximise   gain_bias[k] + sum of gain_weight[j][r]
      subject to cost_bias[k] + sum of cost_weight[j][r] <= capacity.
Layer positions j count from the end (0 = the classifier). A layer's weights may train only inside the bias
region (j < k): its gradient has to reach it anyway, which is what the region's cost pays for, and its bias
gradient is then almost free. With k fixed, the weight terms are independent (plan_memory.py), so the problem is
a group knapsack per k.

`knapsack_dp` solves it exactly with a Pareto-frontier DP: after the first j layers (from the end) the frontier
holds every non-dominated (cost, gain) of weight choices among them; the answer for k is the best frontier
point that fits capacity - cost_bias[k]. Costs stay exact integers (bytes) whatever their size: the frontier
never grows past the number of distinct gains, so no capacity-sized table is needed (a host budget of
gigabytes costs the same as 256 KB). `brute_force` enumerates everything (tests); `evolutionary` is a seeded
evolutionary search, the alternative TTE mentions, kept for comparison.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RATIOS = (0.125, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Option:
    cost: int
    gain: float
    # A bias region none of whose layers has a bias (a bias-less classifier): it pays for the gradient to reach
    # its layers but trains nothing by itself, so it is a valid choice only with at least one weight in it.
    empty: bool = False


@dataclass
class Problem:
    # bias[k-1]: biases of the last k layers (None: not a valid choice, e.g. a region without any bias)
    bias: list[Option | None]
    # weights[j]: ratio -> option for the layer at position j from the end (missing ratio: not offered)
    weights: list[dict[float, Option]]

    @property
    def k_max(self) -> int:
        return len(self.bias)

    def cost(self, k: int, ratios: dict[int, float]) -> int:
        return self.bias[k - 1].cost + sum(self.weights[j][r].cost for j, r in ratios.items() if r)

    def gain(self, k: int, ratios: dict[int, float]) -> float:
        return self.bias[k - 1].gain + sum(self.weights[j][r].gain for j, r in ratios.items() if r)

    def valid(self, k: int, ratios: dict[int, float]) -> bool:
        """A plan trains something: its region has a bias, or it trains a weight."""
        b = self.bias[k - 1]
        return b is not None and (not b.empty or any(ratios.values()))

    def cheapest_weight(self, k: int) -> tuple[int, float] | None:
        """(position, ratio) of the cheapest weight option inside region k (what an empty region needs)."""
        opts = [(o.cost, j, r) for j in range(min(k, len(self.weights))) for r, o in self.weights[j].items()]
        if not opts:
            return None
        _, j, r = min(opts)
        return j, r

    def smallest_choice(self, k: int) -> dict[int, float] | None:
        """The weights of region k's cheapest valid plan: none, or for an empty region its cheapest weight."""
        b = self.bias[k - 1]
        if b is None:
            return None
        if not b.empty:
            return {}
        w = self.cheapest_weight(k)
        return None if w is None else {w[0]: w[1]}

    def smallest(self) -> tuple[int, int] | None:
        """(k, cost) of the cheapest valid plan: some bias region alone (weights only add cost), or an empty
        region with its cheapest weight."""
        valid = [(self.cost(k, r), k) for k in range(1, self.k_max + 1)
                 if (r := self.smallest_choice(k)) is not None]
        if not valid:
            return None
        cost, k = min(valid)
        return k, cost


@dataclass
class Choice:
    k: int
    ratios: dict[int, float]          # position from the end -> ratio (only non-zero ones)
    cost: int
    gain: float

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "weights": {str(j): r for j, r in sorted(self.ratios.items())}, "cost": int(self.cost),
                "gain": float(self.gain)}


@dataclass
class SearchResult:
    best: Choice | None
    trace: list[dict[str, Any]] = field(default_factory=list)
    method: str = "dp"
    evaluated: int = 0


def _better(a: Choice, b: Choice | None) -> bool:
    """More gain wins; then less memory; then fewer biases (deterministic ties)."""
    if b is None:
        return True
    if not math.isclose(a.gain, b.gain, rel_tol=0, abs_tol=1e-12):
        return a.gain > b.gain
    return (a.cost, a.k) < (b.cost, b.k)


class _Frontier:
    """A Pareto frontier as parallel arrays: cost (int64, ascending), gain (float64, strictly ascending) and the
    node of each point's weight choice in a shared `_Nodes` table (a choice is a chain of (position, ratio) links:
    extending it is O(1), where copying tuples made the DP quadratic in the number of layers)."""

    def __init__(self, cost: np.ndarray, gain: np.ndarray, node: np.ndarray):
        self.cost, self.gain, self.node = cost, gain, node

    def __len__(self) -> int:
        return len(self.cost)


class _Nodes:
    """Weight choices as linked nodes: node 0 is the empty choice; node n adds (j[n], r[n]) to parent[n]."""

    def __init__(self):
        self.parent, self.j, self.r = [-1], [-1], [0.0]

    def add(self, parents: np.ndarray, j: int, ratios: np.ndarray) -> np.ndarray:
        first = len(self.parent)
        self.parent.extend(int(p) for p in parents)
        self.j.extend([j] * len(parents))
        self.r.extend(float(x) for x in ratios)
        return np.arange(first, first + len(parents), dtype=np.int64)

    def choice(self, node: int) -> tuple[tuple[int, float], ...]:
        out = []
        while node > 0:
            out.append((self.j[node], self.r[node]))
            node = self.parent[node]
        return tuple(reversed(out))


def _prune(cost: np.ndarray, gain: np.ndarray, cap: int) -> np.ndarray:
    """Indices of the Pareto frontier (ascending cost, strictly ascending gain) of the points that fit `cap`, in
    that order. Ties in (cost, gain) keep the earliest point (a stable sort), as a sorted() of the points did."""
    idx = np.flatnonzero(cost <= cap)
    idx = idx[np.lexsort((-gain[idx], cost[idx]))]
    keep, last = [], None
    for i, g in zip(idx.tolist(), gain[idx].tolist()):
        if last is None or g > last + 1e-12:
            keep.append(i)
            last = g
    return np.asarray(keep, dtype=np.int64)


def _grow(nodes: _Nodes, base: list[_Frontier], extend: list[_Frontier], j: int, opts: dict[float, Option],
          cap: int, made: dict[tuple[int, int], int]) -> tuple[_Frontier, int]:
    """The frontier of `base`'s points as they are followed by every point of `extend` with every option of layer
    j (in that order: the order in which the points were listed before), pruned to `cap`; and how many points
    were considered. `made` shares the nodes created for the same (extended frontier, point x option) between
    the two frontiers of knapsack_dp."""
    oc = np.array([o.cost for o in opts.values()], np.int64)
    og = np.array([o.gain for o in opts.values()], np.float64)
    orr = np.array(list(opts), np.float64)
    costs, gains, origin = [], [], []   # origin: (frontier id, point index, option index or -1)
    for f in base:
        costs.append(f.cost)
        gains.append(f.gain)
        origin.append((id(f), np.arange(len(f)), np.full(len(f), -1)))
    for f in extend:
        if len(oc) and len(f):
            costs.append((f.cost[:, None] + oc[None, :]).ravel())
            gains.append((f.gain[:, None] + og[None, :]).ravel())
            origin.append((id(f), np.repeat(np.arange(len(f)), len(oc)), np.tile(np.arange(len(oc)), len(f))))
    if not costs:
        return _Frontier(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)), 0
    cost, gain = np.concatenate(costs), np.concatenate(gains)
    src = np.concatenate([np.full(len(o[1]), n) for n, o in enumerate(origin)])
    pt = np.concatenate([o[1] for o in origin])
    opt = np.concatenate([o[2] for o in origin])
    keep = _prune(cost, gain, cap)
    frontiers = {id(f): f for f in base + extend}
    node = np.empty(len(keep), np.int64)
    for n, i in enumerate(keep.tolist()):
        f = frontiers[origin[int(src[i])][0]]
        p, o = int(pt[i]), int(opt[i])
        if o < 0:
            node[n] = f.node[p]
            continue
        key = (id(f), p * len(oc) + o)
        if key not in made:
            made[key] = int(nodes.add(np.array([f.node[p]]), j, np.array([orr[o]]))[0])
        node[n] = made[key]
    return _Frontier(cost[keep], gain[keep], node), len(cost)


def knapsack_dp(problem: Problem, capacity: int) -> SearchResult:
    """Exact optimum of the additive model (see the module docstring). Two frontiers: of every weight choice, and
    of the non-empty ones (an empty bias region needs at least one weight, whatever its gain)."""
    valid = [o for o in problem.bias if o is not None]
    result = SearchResult(None, method="dp")
    if not valid:
        return result
    # No weight choice may cost more than what is left after the cheapest bias region.
    cap = capacity - min(o.cost for o in valid)
    nodes = _Nodes()
    empty = _Frontier(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    frontier = (_Frontier(np.zeros(1, np.int64), np.zeros(1), np.zeros(1, np.int64)) if cap >= 0 else empty)
    nonempty = empty
    for k in range(1, problem.k_max + 1):
        j = k - 1
        opts = problem.weights[j] if j < len(problem.weights) else {}
        made: dict[tuple[int, int], int] = {}
        new_frontier, n1 = _grow(nodes, [frontier], [frontier], j, opts, cap, made)
        new_nonempty, n2 = _grow(nodes, [nonempty], [frontier, nonempty], j, opts, cap, made)
        frontier, nonempty = new_frontier, new_nonempty
        result.evaluated += n1 + n2
        b = problem.bias[k - 1]
        if b is None:
            continue
        room = capacity - b.cost
        f = nonempty if b.empty else frontier
        at = int(np.searchsorted(f.cost, room, side="right")) - 1   # the frontier's costs ascend
        if at < 0:
            result.trace.append({"k": k, "fits": False, "bias_cost": b.cost, "frontier": len(frontier)})
            continue
        # the frontier's gain rises with cost: the last point that fits is the best
        cand = Choice(k, dict(nodes.choice(int(f.node[at]))), b.cost + int(f.cost[at]), b.gain + float(f.gain[at]))
        if _better(cand, result.best):
            result.best = cand
        result.trace.append({"k": k, "fits": True, "candidate": cand.to_json(), "frontier": len(frontier),
                             "best_so_far": result.best.to_json()})
    return result


def brute_force(problem: Problem, capacity: int) -> SearchResult:
    """Every plan, for testing the DP on small instances."""
    result = SearchResult(None, method="brute_force")
    for k, b in enumerate(problem.bias, 1):
        if b is None:
            continue
        layers = list(range(min(k, len(problem.weights))))
        for combo in itertools.product(*[[0.0, *problem.weights[j]] for j in layers]):
            ratios = {j: r for j, r in zip(layers, combo) if r}
            result.evaluated += 1
            cost = problem.cost(k, ratios)
            if cost > capacity or not problem.valid(k, ratios):
                continue
            cand = Choice(k, ratios, cost, problem.gain(k, ratios))
            if _better(cand, result.best):
                result.best = cand
    return result


def evolutionary(problem: Problem, capacity: int, *, seed: int = 0, population: int = 32,
                 generations: int = 60, mutation: float = 0.2) -> SearchResult:
    """Seeded evolutionary search over (k, ratio per layer); infeasible genomes score -inf. Not guaranteed
    optimal (the DP is); offered because TTE used one, and as a cross-check on large models."""
    rng = np.random.default_rng(seed)
    result = SearchResult(None, method="evolutionary")
    ks = [k for k, b in enumerate(problem.bias, 1) if b is not None]
    if not ks:
        return result
    n = len(problem.weights)
    choices = [[0.0, *sorted(problem.weights[j])] for j in range(n)]

    def decode(genome: tuple[int, tuple[int, ...]]) -> Choice:
        k, genes = genome
        ratios = {j: choices[j][g] for j, g in enumerate(genes) if j < k and choices[j][g]}
        return Choice(k, ratios, problem.cost(k, ratios), problem.gain(k, ratios))

    def fitness(c: Choice) -> float:
        return c.gain if c.cost <= capacity and problem.valid(c.k, c.ratios) else -math.inf

    def random_genome() -> tuple[int, tuple[int, ...]]:
        # Start small: most random full-width genomes do not fit a tight budget.
        return (int(rng.choice(ks)), tuple(int(rng.integers(len(c))) if rng.random() < 0.3 else 0 for c in choices))

    def mutate(genome):
        k, genes = genome
        if rng.random() < mutation:
            k = int(rng.choice(ks))
        genes = tuple(int(rng.integers(len(choices[j]))) if rng.random() < mutation else g
                      for j, g in enumerate(genes))
        return k, genes

    smallest = problem.smallest()
    first = [0] * n
    for j, r in (problem.smallest_choice(smallest[0]) or {}).items() if smallest else ():
        first[j] = choices[j].index(r)
    pop = ([(smallest[0], tuple(first))] if smallest else []) + [random_genome() for _ in range(population - 1)]
    for gen in range(generations):
        scored = sorted(((fitness(decode(g)), g) for g in pop), key=lambda t: -t[0])
        result.evaluated += len(pop)
        for f, g in scored:
            c = decode(g)
            if f > -math.inf and _better(c, result.best):
                result.best = c
        result.trace.append({"generation": gen, "best_fitness": scored[0][0] if scored[0][0] > -math.inf else None,
                             "feasible": sum(f > -math.inf for f, _ in scored),
                             "best_so_far": result.best.to_json() if result.best else None})
        parents = [g for _, g in scored[: max(2, population // 4)]]
        pop = list(parents)
        while len(pop) < population:
            a, b = (parents[int(i)] for i in rng.integers(len(parents), size=2))
            k = a[0] if rng.random() < 0.5 else b[0]
            genes = tuple(x if rng.random() < 0.5 else y for x, y in zip(a[1], b[1]))
            pop.append(mutate((k, genes)))
    return result


def search(problem: Problem, capacity: int, method: str = "dp", seed: int = 0) -> SearchResult:
    if method == "dp":
        return knapsack_dp(problem, capacity)
    if method == "evolutionary":
        return evolutionary(problem, capacity, seed=seed)
    raise ValueError(f"unknown search method {method!r}")
