"""Deduplication: which failing models are the same bug.

Two failures are the same bug when they fail the same way (signature kind and detail: the mismatch value
class, or the crash's normalized message), need the same culprit passes, and reduce to **the same minimal
pattern up to names and constants**. The pattern's identity is :func:`pattern_hash`, a Merkle hash over the
reduced graph: every tensor is labelled by what produces it (a graph input or constant by its dtype and
rank; a node output by its node's label and output index) and every node by its domain, op type,
attributes and input labels. Names never enter a label, and neither do float values (constants and float
attributes such as ``epsilon``): the same mis-fused LayerNorm with other weights is the same bug. Integer
and string attributes (``keepdims``, ``axis``, ``mode``) do enter, since they select the code path. The
graph's hash is over the *multiset* of node labels and output labels, so node order does not matter.

A crash whose signature carries an exception message is keyed by that message and the culprits (the message
identifies the bug; reduced crash patterns may legitimately differ); a bare exit code or a timeout says too
little, so the pattern is added. An ``unsupported`` refusal is keyed by what the target lacks (:func:`lacking`):
OpenVINO refusing ``ai.onnx.ml.TreeEnsembleRegressor`` ("No conversion rule found"), ``ai.onnx.ml.Scaler`` and
the sequence of maps of a ``ZipMap`` ("Unsupported value_info type") is one missing feature, ``ai.onnx.ml``, where
three messages made three bugs; a refusal that names nothing is keyed by its message. A failure with no reduced
pattern (the target runs only its own model format, or the reduction did not see the failure again) is a group
of its own.

Example:
    >>> import onnx.helper as h
    >>> from onnx import TensorProto
    >>> def relu(name):
    ...     g = h.make_graph([h.make_node("Relu", [name], [name + "_y"], name=name + "_n")], "g",
    ...                      [h.make_tensor_value_info(name, TensorProto.FLOAT, [2])],
    ...                      [h.make_tensor_value_info(name + "_y", TensorProto.FLOAT, [2])])
    ...     return h.make_model(g)
    >>> pattern_hash(relu("a")) == pattern_hash(relu("b"))
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from graphbisect.oracle.outcome import refusal_of
from graphbisect.oracle.signature import FailureKind
from graphbisect.triage.outcome import FAILED, ModelOutcome

__all__ = ["BugGroup", "bug_key", "group_bugs", "lacking", "pattern_hash"]

log = logging.getLogger(__name__)

_A = onnx.AttributeProto


def _h(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _attribute(attr: onnx.AttributeProto) -> Any:
    """An attribute's canonical value: floats and tensors by type and shape only, the rest by value."""
    kind = attr.type
    if kind == _A.FLOAT:
        return "float"
    if kind == _A.FLOATS:
        return ["floats", len(attr.floats)]
    if kind == _A.INT:
        return attr.i
    if kind == _A.INTS:
        return list(attr.ints)
    if kind == _A.STRING:
        return attr.s.decode(errors="replace")
    if kind == _A.STRINGS:
        return [s.decode(errors="replace") for s in attr.strings]
    if kind == _A.TENSOR:
        return ["tensor", attr.t.data_type, len(attr.t.dims)]
    if kind == _A.GRAPH:
        return ["graph", _graph_hash(attr.g)]
    return ["type", int(kind)]


def _value_rank(value: onnx.ValueInfoProto) -> Any:
    tensor = value.type.tensor_type
    return [tensor.elem_type, len(tensor.shape.dim) if tensor.HasField("shape") else None]


def _graph_hash(graph: onnx.GraphProto) -> str:
    labels: dict[str, str] = {}
    constants = {init.name for init in graph.initializer}
    for init in graph.initializer:
        labels[init.name] = _h("const", init.data_type, len(init.dims))
    for value in graph.input:
        if value.name not in constants:
            labels[value.name] = _h("input", _value_rank(value))
    node_labels = []
    for node in graph.node:
        inputs = [labels.get(name, "outer") if name else "none" for name in node.input]
        attrs = sorted((a.name, _attribute(a)) for a in node.attribute)
        label = _h("node", node.domain or "ai.onnx", node.op_type, attrs, inputs)
        node_labels.append(label)
        for index, name in enumerate(node.output):
            if name:
                labels[name] = _h(label, index)
    outputs = sorted(labels.get(value.name, "missing") for value in graph.output)
    return _h("graph", sorted(node_labels), outputs)


def pattern_hash(model: onnx.ModelProto) -> str:
    """The identity of a (reduced) model up to names, node order and float values; see the module docstring.

    Nodes must be in topological order (graphbisect's models always are).
    """
    return _graph_hash(model.graph)


_RAISED = frozenset(kind.value for kind in FailureKind if kind.raised)
_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})


def lacking(signature: Mapping[str, Any] | None, domains: Iterable[str] = ()) -> str | None:
    """What a target that refused a model lacks, as its bugs are grouped: the domain of the refused op when it has
    one (``ai.onnx.ml``), else the domains other than ``ai.onnx`` of the reduced model's nodes (``domains``: a
    refusal that names no op, such as OpenVINO's "Unsupported value_info type" for a ``ZipMap``'s sequence of
    maps or IREE's ``onnx.Scaler``), else the op or type the refusal names (``Loop``); None when the failure is
    not a refusal or names nothing.

    Example:
        >>> lacking({"kind": "unsupported", "detail": "RuntimeError: Unsupported value_info type: probabilities"},
        ...         ["ai.onnx.ml"])
        'ai.onnx.ml'
        >>> lacking({"kind": "unsupported", "detail": "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : "
        ...          "Could not find an implementation for Add(14) node with name 'add'"})
        'Add'
    """
    if not signature or signature.get("kind") != FailureKind.UNSUPPORTED.value:
        return None
    refusal = refusal_of(None, str(signature.get("detail", "")))
    if refusal is None:  # a refusal recorded under another rule: the rule of today decides
        return None
    family = refusal.family
    if "." in family and " " not in family:
        return family
    others = sorted(set(domains) - _DEFAULT_DOMAINS)
    return ", ".join(others) if others else family or None


def bug_key(outcome: ModelOutcome) -> str:
    """The deduplication key of a failed model's outcome (see the module docstring)."""
    signature = dict(outcome.signature or {})
    kind, detail = str(signature.get("kind", "")), str(signature.get("detail", ""))
    if kind == FailureKind.UNSUPPORTED.value and outcome.lacks:
        return _h("bug", kind, "lacks", outcome.lacks, sorted(outcome.culprits))[:12]
    by_message = kind in _RAISED and detail and not detail.startswith("exit")
    # Without a reduced pattern (the target runs only its own format, or the failure did not reproduce when
    # reduced) nothing shows two such failures are one bug: each stands alone rather than merging by kind.
    pattern = None if by_message else outcome.pattern or f"unreduced model {outcome.name}"
    return _h("bug", kind, detail, sorted(outcome.culprits), pattern)[:12]


@dataclass(frozen=True)
class BugGroup:
    """One distinct bug: the failed models that share a :func:`bug_key`, and the smallest bundle among them."""

    key: str
    signature: dict[str, Any]
    culprits: tuple[str, ...]
    pattern: str | None
    op_types: tuple[str, ...]  # of the smallest reduced model
    models: tuple[str, ...]  # names, sorted
    smallest: str  # the model whose reduction is smallest (ties: first by name)
    smallest_bundle: str | None
    smallest_nodes: int | None
    lacks: str | None = None  # an unsupported refusal's group: what the target lacks (:func:`lacking`)
    #: what the grouping rests on, the checker's share marked (:func:`graphbisect.workflows.triage_claims.
    #: grouping_check`); empty: not checked
    checked: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.models)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "count": self.count, "signature": self.signature, "culprits": list(self.culprits),
                "pattern": self.pattern, "op_types": list(self.op_types), "models": list(self.models),
                "smallest": self.smallest, "smallest_bundle": self.smallest_bundle,
                "smallest_nodes": self.smallest_nodes, "lacks": self.lacks, "checked": dict(self.checked)}


def group_bugs(outcomes: Iterable[ModelOutcome]) -> list[BugGroup]:
    """Group the failed outcomes by :func:`bug_key`; most frequent bug first, then by key (deterministic)."""
    groups: dict[str, list[ModelOutcome]] = {}
    for outcome in outcomes:
        if outcome.status == FAILED:
            groups.setdefault(bug_key(outcome), []).append(outcome)
    result = [_group(key, members) for key, members in groups.items()]
    return sorted(result, key=lambda g: (-g.count, g.key))


def _group(key: str, members: Sequence[ModelOutcome]) -> BugGroup:
    ordered = sorted(members, key=lambda o: o.name)
    best = min(ordered, key=lambda o: (o.final_nodes if o.final_nodes is not None else 1 << 62, o.name))
    return BugGroup(key=key, signature=dict(best.signature or {}), culprits=best.culprits, pattern=best.pattern,
                    op_types=best.op_types, models=tuple(o.name for o in ordered), smallest=best.name,
                    smallest_bundle=best.bundle, smallest_nodes=best.final_nodes, lacks=best.lacks)
