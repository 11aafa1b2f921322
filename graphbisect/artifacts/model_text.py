"""A model as ONNX text (``onnx.printer``): every node with its attributes, the opset and the shapes.

What a maintainer reads first in a bug report: a LayerNorm bug caused by ``keepdims=0`` shows that
attribute here, and nowhere in a table of node names. Large initializers are shown by type and shape only
(``["location": "model.onnx (4096 values not shown)"]``), so the text stays readable, and the opset list
names the domains the model's nodes use (ONNX Runtime's optimized model imports nine, used or not).
"""

from __future__ import annotations

import logging

import onnx

__all__ = ["MAX_SHOWN_ELEMENTS", "MAX_TEXT_CHARS", "onnx_text"]

log = logging.getLogger(__name__)

#: Initializers with more elements than this are shown without their values.
MAX_SHOWN_ELEMENTS = 16
#: Longer texts are cut (with a note): a report is read by people.
MAX_TEXT_CHARS = 20_000


def onnx_text(model: onnx.ModelProto, *, max_chars: int = MAX_TEXT_CHARS, metadata: bool = True) -> str | None:
    """``model`` as ONNX text, large weights elided, opsets of the domains its nodes use; None when
    ``onnx.printer`` cannot print it. ``metadata=False`` leaves out ``metadata_props`` (a compiled model
    copies its source's, which the report already shows).

    Example:
        >>> from graphbisect.examples.patterns import pattern_model
        >>> "keepdims: int = 0" in onnx_text(pattern_model("layernorm_keepdims0"))
        True
    """
    import onnx.printer

    shown = onnx.ModelProto()
    shown.CopyFrom(model)
    for graph in _graphs(shown.graph):
        for tensor in graph.initializer:
            _elide(tensor)
    used = _used_domains(shown)
    kept = [imp for imp in shown.opset_import if (imp.domain or "") in used]
    del shown.opset_import[:]
    shown.opset_import.extend(kept)
    if not metadata:
        del shown.metadata_props[:]
    try:
        text = onnx.printer.to_text(shown)
    except Exception as exc:  # the printer rejects some models (unknown types); the report says so
        log.warning("onnx.printer cannot print the model: %s: %s", type(exc).__name__, exc)
        return None
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... ({len(text) - max_chars} more characters: see model.onnx)"
    return text


def _elide(tensor: onnx.TensorProto) -> None:
    count = 1
    for dim in tensor.dims:
        count *= dim
    if count <= MAX_SHOWN_ELEMENTS or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return
    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(name)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", f"model.onnx ({count} values not shown)"


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    found += _graphs(sub)
    return found


def _used_domains(model: onnx.ModelProto) -> set[str]:
    """The domains of every node (subgraphs and local functions too) and of the functions; the default
    domain always."""
    used = {""}
    for graph in _graphs(model.graph):
        used.update(node.domain or "" for node in graph.node)
    for function in model.functions:
        used.add(function.domain or "")
        used.update(node.domain or "" for node in function.node)
    return used
