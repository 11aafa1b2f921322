"""Deduplication: the pattern hash ignores names, node order and float values, but not structure or modes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.triage.dedup import bug_key, group_bugs, pattern_hash
from graphbisect.triage.outcome import ModelOutcome


def norm(prefix: str, *, keepdims: int = 0, eps: float = 1e-5, gamma: float = 1.0, swap: bool = False
         ) -> onnx.ModelProto:
    p = prefix
    nodes = [helper.make_node("ReduceMean", [f"{p}x"], [f"{p}m"], keepdims=keepdims, axes=[-1], name=f"{p}rm"),
             helper.make_node("Sub", [f"{p}x", f"{p}m"], [f"{p}d"], name=f"{p}sub"),
             helper.make_node("Mul", [f"{p}d", f"{p}g"], [f"{p}y"], name=f"{p}mul"),
             helper.make_node("LeakyRelu", [f"{p}x"], [f"{p}z"], alpha=eps, name=f"{p}lr")]
    if swap:
        nodes = [nodes[3], *nodes[:3]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(f"{p}x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info(f"{p}y", TensorProto.FLOAT, [2, 8]),
                               helper.make_tensor_value_info(f"{p}z", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(np.full([8], gamma, np.float32), f"{p}g")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pattern_hash_ignores_names_order_and_floats() -> None:
    base = pattern_hash(norm("a/"))
    assert pattern_hash(norm("other.")) == base
    assert pattern_hash(norm("a/", eps=0.3, gamma=2.0)) == base
    assert pattern_hash(norm("a/", swap=True)) == base


def test_pattern_hash_sees_integer_attributes() -> None:
    assert pattern_hash(norm("a/", keepdims=1)) != pattern_hash(norm("a/"))


def outcome(name: str, pattern: str | None, *, kind: str = "mismatch", detail: str = "float", nodes: int = 6,
            culprits: tuple[str, ...] = ("P",)) -> ModelOutcome:
    return ModelOutcome(name=name, source=name, status="failed", signature={"kind": kind, "detail": detail},
                        culprits=culprits, pattern=pattern, final_nodes=nodes, bundle=f"b/{name}")


def test_grouping() -> None:
    groups = group_bugs([outcome("m2", "p1", nodes=4), outcome("m1", "p1"), outcome("m3", "p2"),
                         outcome("m4", "p1", culprits=("Q",)),
                         outcome("c1", "x", kind="crash-load", detail="Fail: bad clip"),
                         outcome("c2", "y", kind="crash-load", detail="Fail: bad clip"),
                         ModelOutcome(name="ok", source="ok", status="passed")])
    assert sorted(g.models for g in groups[:2]) == [("c1", "c2"), ("m1", "m2")]  # most frequent first
    assert sorted(g.models for g in groups[2:]) == [("m3",), ("m4",)]
    (pair,) = [g for g in groups if g.models == ("m1", "m2")]
    assert pair.smallest == "m2" and pair.smallest_bundle == "b/m2"
    assert bug_key(outcome("a", "p", kind="crash-run", detail="exit -11")) != \
        bug_key(outcome("a", "q", kind="crash-run", detail="exit -11"))


def test_failures_without_a_reduced_pattern_are_not_merged() -> None:
    """Two mismatches that were never reduced share a kind but nothing shows they are one bug."""
    groups = group_bugs([outcome("a", None), outcome("b", None), outcome("c", "p"), outcome("d", "p")])
    assert sorted(g.models for g in groups) == [("a",), ("b",), ("c", "d")]
    # A crash's message identifies its bug with or without a pattern.
    crashes = [outcome(n, None, kind="crash-load", detail="Fail: bad clip") for n in ("x", "y")]
    assert [g.models for g in group_bugs(crashes)] == [("x", "y")]
