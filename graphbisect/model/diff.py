"""What differs between two models a target ran: the answer to "why did the result not re-verify?".

A reduction certifies a model by re-running it; when that run does not fail like the run that accepted
it, either the target is flaky (the *same* model gave two outcomes) or the two models are not the same.
:func:`model_differences` names the differences that can change what a runtime builds — the model's
version and imports, its graph inputs, outputs and their declared types, its ``value_info``, nodes and
initializers — so a report says which one instead of guessing.

Example:
    >>> a = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    >>> b = onnx.ModelProto(); b.CopyFrom(a); b.ir_version = 3
    >>> model_differences(a, b)[0].startswith("IR version")
    True
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import onnx

__all__ = ["describe_type", "model_differences"]

logger = logging.getLogger(__name__)

#: At most this many differences are listed (the first ones are the telling ones).
_MAX_LISTED = 6


def describe_type(value: onnx.ValueInfoProto) -> str:
    """A declaration as text: ``FLOAT[batch,3,?]``, ``FLOAT[rank unknown]``, ``untyped``, or the proto's
    own text for sequences, optionals and maps."""
    if not value.type.ByteSize():
        return "untyped"
    if not value.type.HasField("tensor_type"):
        return str(value.type).replace("\n", " ").strip()
    tensor_type = value.type.tensor_type
    name = onnx.TensorProto.DataType.Name(tensor_type.elem_type) if tensor_type.elem_type else "UNDEFINED"
    if not tensor_type.HasField("shape"):
        return f"{name}[rank unknown]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]
    return f"{name}[{','.join(dims)}]"


def _declarations(values: Iterable[onnx.ValueInfoProto]) -> dict[str, str]:
    return {value.name: describe_type(value) for value in values}


def _compare(what: str, old: dict[str, str], new: dict[str, str]) -> list[str]:
    lines = [f"{what} {name!r}: {old[name]} in the tested model, {new.get(name, 'absent')} in the re-verified one"
             for name in old if old[name] != new.get(name)]
    lines += [f"{what} {name!r}: absent from the tested model, {new[name]} in the re-verified one"
              for name in new if name not in old]
    return lines


def model_differences(tested: onnx.ModelProto, verified: onnx.ModelProto) -> list[str]:
    """Differences between the model a target ran (``tested``) and the one re-verified, most telling first;
    empty when they are the same model for every purpose a runtime has (weights are compared by name)."""
    found: list[str] = []
    if tested.ir_version != verified.ir_version:
        found.append(f"IR version {tested.ir_version} in the tested model, "
                     f"{verified.ir_version} in the re-verified one")
    imports = ({op.domain or "ai.onnx": op.version for op in m.opset_import} for m in (tested, verified))
    old_imports, new_imports = imports
    if old_imports != new_imports:
        found.append(f"opset imports {old_imports} in the tested model, {new_imports} in the re-verified one")
    old_functions = sorted(f"{f.domain}:{f.name}" for f in tested.functions)
    new_functions = sorted(f"{f.domain}:{f.name}" for f in verified.functions)
    if old_functions != new_functions:
        found.append(f"functions {old_functions} in the tested model, {new_functions} in the re-verified one")
    a, b = tested.graph, verified.graph
    found += _compare("graph input", _declarations(a.input), _declarations(b.input))
    found += _compare("graph output", _declarations(a.output), _declarations(b.output))
    found += _compare("value_info", _declarations(a.value_info), _declarations(b.value_info))
    old_nodes = [(n.name, n.op_type) for n in a.node]
    new_nodes = [(n.name, n.op_type) for n in b.node]
    if old_nodes != new_nodes:
        found.append(f"nodes: {len(old_nodes)} in the tested model, {len(new_nodes)} in the re-verified one"
                     if len(old_nodes) != len(new_nodes) else "the nodes differ in name, type or order")
    else:
        changed = [n.name for n, m in zip(a.node, b.node, strict=True)
                   if n.SerializeToString(deterministic=True) != m.SerializeToString(deterministic=True)]
        if changed:
            found.append(f"node(s) {', '.join(map(repr, changed[:3]))} have other inputs, outputs or attributes")
    old_inits = {t.name for t in a.initializer}
    new_inits = {t.name for t in b.initializer}
    if old_inits != new_inits:
        moved = sorted(old_inits ^ new_inits)[:3]
        found.append(f"initializers differ: {', '.join(map(repr, moved))} is constant in only one of them")
    if len(found) > _MAX_LISTED:
        found = [*found[:_MAX_LISTED], f"... and {len(found) - _MAX_LISTED} more"]
    return found
