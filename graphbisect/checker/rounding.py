"""The specification's ``rounding`` verdict, re-established by the checker: a rounding flip, not a bug.

A bundle's ``spec_check`` may say that the side ``onnx.reference`` disagrees with (``rounding.side``) differs
from it only where a node rounds floats into integers (``rounding.node``, e.g. a ``DynamicQuantizeLinear``
after an ``Erf`` one ulp off): the node's float inputs agree within the tolerance but not bit for bit, and its
integer outputs land one step apart. :func:`check_flip` checks that with plain runs of its own:

1. the accused side and ``onnx.reference`` each run the model with every node's output exposed (their outputs
   compared bit for bit with their plain runs first: exposing a tensor may change what a runtime computes);
2. every node where the difference *starts* (an output differs beyond the tolerance, no input does) must be a
   flip: its differing outputs are integers exactly one step apart, no float output differs, and a float input
   moved (identical inputs rounded differently are the node's own arithmetic); the recorded node is the first;
3. the recorded node run alone by the accused side on the reference's values of its inputs gives the
   reference's integers: the same inputs round the same, so the flip comes from the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphbisect.checker.removal import declare, exposed
from graphbisect.checker.runs import Runner
from graphbisect.checker.values import Limits, bit_identical, compare_outputs

__all__ = ["check_flip"]


def check_flip(model: onnx.ModelProto, claim: Mapping[str, Any], *, side: Runner, reference: Runner,
               feeds: Mapping[str, Any], plain: tuple[Mapping[str, Any], Mapping[str, Any]], limits: Limits,
               scratch: Path) -> tuple[bool | None, str]:
    """(holds, evidence) of the flip ``claim`` (``spec_check.rounding``) on ``model``: ``side`` runs the accused
    side's spec, ``plain`` is (its plain outputs, the reference's)."""
    names = [name for node in model.graph.node for name in node.output if name]
    path = scratch / "rounding.onnx"
    onnx.save(exposed(model, names), str(path))
    runs = side.run(path, dict(feeds)), reference.run(path, dict(feeds))
    for run, before, who in zip(runs, plain, ("the accused side", "onnx.reference")):
        if not run.ok:
            return None, f"{who} does not run the model with its tensors exposed: {run.crash_text()[:200]}"
        if not bit_identical({k: run.outputs.get(k) for k in before}, dict(before)):
            return None, f"{who} computes other outputs with its tensors exposed, so they cannot show the flip"
    a, b = {**feeds, **runs[0].outputs}, {**feeds, **runs[1].outputs}
    starts = [node for node in model.graph.node if _starts(node, a, b, limits)]
    if not starts:
        return False, "no node is where the difference from onnx.reference starts"
    for node in starts:
        why = _not_a_flip(node, a, b, limits)
        if why is not None:
            return False, f"the difference starts at {node.op_type} {(node.name or node.output[0])!r}, {why}"
    first = starts[0]
    if (first.name or first.output[0]) != claim.get("node") or first.op_type != claim.get("op"):
        return False, (f"the difference starts at {first.op_type} {(first.name or first.output[0])!r}, not at "
                       f"{claim.get('op')} {claim.get('node')!r}")
    alone = _alone(model, first, b, side, scratch)
    if alone is not None:
        return alone
    return True, (f"the difference starts only at {', '.join(repr(n.name or n.output[0]) for n in starts)}: "
                  "inputs within the tolerance (not bit for bit), integer outputs one step apart; run alone on "
                  "onnx.reference's inputs it rounds as onnx.reference does")


def _differs(name: str, a: Mapping[str, Any], b: Mapping[str, Any], limits: Limits) -> bool:
    return any(d.failed for d in compare_outputs({name: b[name]}, {name: a[name]}, limits))


def _starts(node: onnx.NodeProto, a: Mapping[str, Any], b: Mapping[str, Any], limits: Limits) -> bool:
    outputs = [n for n in node.output if n in a and n in b]
    inputs = [n for n in node.input if n in a and n in b]
    return any(_differs(n, a, b, limits) for n in outputs) and not any(_differs(n, a, b, limits) for n in inputs)


def _not_a_flip(node: onnx.NodeProto, a: Mapping[str, Any], b: Mapping[str, Any], limits: Limits) -> str | None:
    """Why the difference starting at ``node`` is no rounding flip (None: it is one)."""
    for name in (n for n in node.output if n in a and n in b and _differs(n, a, b, limits)):
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.dtype.kind not in "iu" or y.dtype.kind not in "iu":
            return f"where {name!r} ({y.dtype}) differs: float arithmetic, not a rounding"
        step = int(np.max(np.abs(x.astype(np.int64) - y.astype(np.int64))))
        if step != 1:
            return f"where {name!r} is {step} integer steps off, not one"
    moved = [n for n in node.input if n in a and n in b and np.asarray(b[n]).dtype.kind == "f"
             and not bit_identical({n: a[n]}, {n: b[n]})]
    return None if moved else "whose inputs are identical: the node's own arithmetic differs"


def _alone(model: onnx.ModelProto, node: onnx.NodeProto, b: Mapping[str, Any], side: Runner,
           scratch: Path) -> tuple[bool | None, str] | None:
    """``node`` alone, run by the accused side on onnx.reference's values of its inputs: None when it rounds them
    as onnx.reference did, else (holds, evidence)."""
    inputs = [n for n in dict.fromkeys(node.input) if n and n in b]
    outputs = [n for n in node.output if n and n in b]
    try:
        graph = helper.make_graph([node], "rounding", [declare(n, b[n]) for n in inputs],
                                  [declare(n, b[n]) for n in outputs])
    except TypeError as exc:
        return None, f"the node alone cannot be built ({exc})"
    path = scratch / "rounding-alone.onnx"
    onnx.save(helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version), str(path))
    run = side.run(path, {n: b[n] for n in inputs})
    if not run.ok:
        return None, f"the accused side does not run the node alone: {run.crash_text()[:200]}"
    wrong = [n for n in outputs if np.asarray(b[n]).dtype.kind in "iu" and not bit_identical({n: run.outputs.get(n)},
                                                                                              {n: b[n]})]
    if wrong:
        return False, (f"run alone on onnx.reference's inputs, {node.op_type} {(node.name or node.output[0])!r} "
                       f"gives other integers ({', '.join(map(repr, wrong))}): its own arithmetic, not a flip")
    return None

