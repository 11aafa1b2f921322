"""The compiled-graph probe that `compare` and `reduce` share: which target tensors to expose, and why.

A target with :attr:`Capability.COMPILED_GRAPH` is run with its registry row's ``compiled_option``
(``save_optimized=1``, ``report_exec=1``, ``report_layers=1``); the run's info then describes the graph it
compiled (:mod:`graphbisect.localize.compiled`). The layerwise probe exposes only the tensors that survive
in that graph, so the target compiles the probe the way it compiled the model and a bug inside a fusion
stays visible; each diverging compiled node maps back to the original nodes it replaced. Without a
description (or with ``all_tensors``) the probe exposes every intermediate, as before.

Example:
    >>> from graphbisect.backends import BackendSpec
    >>> str(describing_spec(BackendSpec.parse("ort:opt_level=all")))
    'ort:opt_level=all,save_optimized=1'
    >>> describing_spec(BackendSpec.parse("reference")) is None
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from graphbisect.backends import BackendSpec, Capability, resolve
from graphbisect.localize.compiled import CompiledGraph, compiled_graph
from graphbisect.model import Model

__all__ = ["ProbePlan", "compiled_of", "describing_spec", "discard_description", "plan_probe"]

log = logging.getLogger(__name__)


def describing_spec(spec: BackendSpec) -> BackendSpec | None:
    """``spec`` asked to describe what it compiles, or None when its backend cannot."""
    _, info = resolve(spec, require_available=False)
    if not info.has(Capability.COMPILED_GRAPH) or info.compiled_option is None:
        return None
    key, value = info.compiled_option
    return spec.with_options(**{key: value})


@dataclass(frozen=True)
class ProbePlan:
    """The tensors a layerwise probe of the target exposes, and the compiled graph they come from."""

    names: tuple[str, ...]  # intermediates to expose, topological order (graph outputs excluded)
    compiled: CompiledGraph | None  # None: the target did not describe its graph, every tensor is probed
    vanished: frozenset[str]  # intermediates the compiled graph no longer has

    def describe(self) -> str:
        if self.compiled is None:
            return f"every intermediate tensor ({len(self.names)})"
        return (f"the {len(self.names)} tensors that survive in the target's {self.compiled.source} "
                f"({len(self.vanished)} fused away)")


def compiled_of(model: Model, info: Mapping[str, Any]) -> CompiledGraph | None:
    """The compiled graph a run of a :func:`describing_spec` target reported on ``model``, or None."""
    compiled = compiled_graph(model.nodes, model.output_names, info)
    if compiled is not None:
        log.info("%s", compiled.summary())
    return compiled


def plan_probe(model: Model, compiled: CompiledGraph | None, *, among: Collection[str] | None = None) -> ProbePlan:
    """The target's probe: the intermediates that survive in ``compiled`` (every one when it is None).

    ``among`` restricts the candidates (e.g. to the tensors the oracle captured).
    """
    outputs = set(model.output_names)
    names = [n for n in model.intermediate_names() if n not in outputs and (among is None or n in among)]
    if compiled is None:
        return ProbePlan(tuple(names), None, frozenset())
    surviving = compiled.surviving
    return ProbePlan(tuple(n for n in names if n in surviving), compiled,
                     frozenset(n for n in names if n not in surviving))


def discard_description(info: Mapping[str, Any]) -> None:
    """Delete a saved optimized model and the external-data files it references, once read.

    ONNX Runtime writes every weight beside the optimized graph (``save_optimized=1``): on a large model
    that is a second copy of its weights, which nothing needs after :func:`compiled_of`.
    """
    saved = info.get("optimized_model")
    if not isinstance(saved, str) or not Path(saved).is_file():
        return
    path = Path(saved)
    locations: set[str] = set()
    with contextlib.suppress(Exception):  # an unreadable file is still removed below
        proto = onnx.load(str(path), load_external_data=False)
        for tensor in proto.graph.initializer:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    for location in locations:
        target = (path.parent / location).resolve()
        if target.parent == path.parent.resolve():  # only files ORT wrote beside the model
            target.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
