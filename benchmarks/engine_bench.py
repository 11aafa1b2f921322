"""Benchmark of the reduction engine on synthetic failures: how many backend invocations each search needs.

A case hides ``k`` culprit units among ``n``; a candidate fails when it keeps all of them (the common
"these nodes together trigger the bug" shape). Every test that is not a cache hit is one backend
invocation. For each ``(n, k)`` the first table shows, over random cases (fixed seeds, so the numbers are
reproducible), the mean invocations, the worst case and the mean tests requested (cache hits included)
for ddmin, ProbDD, and, for single culprits, the ``find_one`` binary search.

The second table shows the parallel trade-off with ``jobs=4``: mean invocations (including speculative
ones the serial search would not have made) and mean *batches*, the sequential rounds of tests, which is
what wall time is proportional to when each backend run takes the same time. Results are identical to
``jobs=1`` by construction (checked here).

Run: ``python benchmarks/engine_bench.py [--cases 30] [--seed 0] [--jobs 4]``
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from graphbisect.engine import Evaluator, Outcome, SearchResult, ddmin, find_one, probdd

SIZES = (16, 128, 1024)
CULPRITS = (1, 2, 4)
SEARCHES: dict[str, Callable[[Evaluator, int], SearchResult]] = {
    "ddmin": lambda ev, n: ddmin(ev),
    "probdd": lambda ev, n: probdd(ev),
    "find_one": lambda ev, n: find_one(ev, range(n)),
}


def make_test(culprits: frozenset[int]) -> Callable[[frozenset[int]], Outcome]:
    def test(keep: frozenset[int]) -> Outcome:
        return Outcome.FAIL if culprits <= keep else Outcome.PASS

    return test


class BatchCounter:
    """A ``map``-style executor that runs inline and counts the batches (and candidates) it was given."""

    def __init__(self) -> None:
        self.batches = 0
        self.mapped = 0

    def __call__(self, fn: Callable[[frozenset[int]], Any], keeps: Sequence[frozenset[int]]) -> list[Any]:
        self.batches += 1
        self.mapped += len(keeps)
        return [fn(keep) for keep in keeps]


def run_case(name: str, n: int, culprits: frozenset[int], jobs: int = 1) -> tuple[SearchResult, int]:
    """One search on one case, checked against the known answer; returns it and its sequential rounds.

    The engine runs a batch of one candidate inline, without the executor, so the rounds are the
    executor's batches plus the runs it never saw.
    """
    executor = BatchCounter()
    ev = Evaluator(make_test(culprits), n, jobs=jobs, executor=executor)
    result = SEARCHES[name](ev, n)
    if result.keep != culprits or not result.minimal:
        raise AssertionError(f"{name} n={n} culprits={sorted(culprits)} gave {sorted(result.keep)}")
    return result, executor.batches + result.stats.runs - executor.mapped


def cases(n: int, k: int, count: int, seed: int) -> list[frozenset[int]]:
    rng = random.Random(f"{seed}-{n}-{k}")
    return [frozenset(rng.sample(range(n), k)) for _ in range(count)]


def serial_cell(name: str, n: int, group: list[frozenset[int]]) -> str:
    results = [run_case(name, n, c)[0] for c in group]
    invocations = [r.stats.invocations for r in results]
    tests = statistics.mean(r.stats.tests for r in results)
    return f"{statistics.mean(invocations):6.1f} {max(invocations):4d} {tests:6.1f}"


def parallel_cell(name: str, n: int, group: list[frozenset[int]], jobs: int) -> str:
    invocations, batches = [], []
    for culprits in group:
        serial, _ = run_case(name, n, culprits)
        parallel, count = run_case(name, n, culprits, jobs)
        if parallel.keep != serial.keep or parallel.stats.tests != serial.stats.tests:
            raise AssertionError(f"{name} jobs={jobs} differs from jobs=1 on {sorted(culprits)}")
        invocations.append(parallel.stats.invocations)
        batches.append(count)
    return f"{statistics.mean(invocations):6.1f} {statistics.mean(batches):6.1f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=30, help="random cases per (n, k) (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=4, help="parallelism of the second table (default 4)")
    args = parser.parse_args()

    serial_rows, parallel_rows = [], []
    for n in SIZES:
        for k in CULPRITS:
            group = cases(n, k, args.cases, args.seed)
            names = ("ddmin", "probdd", "find_one") if k == 1 else ("ddmin", "probdd")
            serial_rows.append([str(n), str(k), *(serial_cell(m, n, group) if m in names else "-" for m in SEARCHES)])
            parallel_rows.append(
                [str(n), str(k), *(parallel_cell(m, n, group, args.jobs) for m in ("ddmin", "probdd"))]
            )

    print(f"Backend invocations to isolate k culprits among n units ({args.cases} random cases each).")
    print("Each cell: mean invocations, worst invocations, mean tests requested (cache hits included).\n")
    print("\n".join(table(["n", "k", *(f"{m}: mean  max  tests" for m in SEARCHES)], serial_rows)))
    print(f"\nParallel evaluation, jobs={args.jobs} (same results as jobs=1, verified).")
    print("Each cell: mean invocations (speculative runs included), mean sequential batches of tests")
    print("(with jobs=1 the batches equal the invocations of the first table).\n")
    print("\n".join(table(["n", "k", "ddmin: invocations batches", "probdd: invocations batches"], parallel_rows)))


if __name__ == "__main__":
    main()
