"""Reduction strategies: each turns a keep-set of units into a candidate. One table lists them all.

The table drives the CLI help and the docs; a strategy declares the backend capabilities it needs instead
of naming backends. Each strategy is a deterministic walk in its own module over units the generic engine
(:mod:`graphbisect.engine`) keeps or removes.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphbisect.backends.base import Capability

__all__ = ["STRATEGIES", "Strategy", "get_strategy"]


@dataclass(frozen=True)
class Strategy:
    name: str
    units: str  # what the engine keeps or removes
    summary: str
    module: str
    requires: frozenset[Capability]  # of the target backend
    command: str  # the CLI subcommand that runs it


STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        name="subgraph",
        units="nodes",
        summary="the fewest nodes that still fail the same way; cut tensors fed with the oracle's values",
        module="graphbisect.strategies.subgraph",
        requires=frozenset({Capability.ONNX_INPUT}),
        command="reduce",
    ),
    Strategy(
        name="passes",
        units="optimization passes",
        summary="the fewest fired passes whose disabling removes the failure, and the fewest that must stay enabled",
        module="graphbisect.strategies.passes",
        requires=frozenset({Capability.PASSES}),
        command="passes",
    ),
    Strategy(
        name="tactics",
        units="(node, kernel choice) pairs",
        summary="the fewest kernel choices of a bad build that make a good build bad, confirmed by replay",
        module="graphbisect.strategies.tactics",
        requires=frozenset({Capability.TACTICS}),
        command="tactics",
    ),
)


def get_strategy(name: str) -> Strategy:
    for strategy in STRATEGIES:
        if strategy.name == name:
            return strategy
    raise KeyError(f"no strategy {name!r}; known: {', '.join(s.name for s in STRATEGIES)}")
