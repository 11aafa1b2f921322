"""OpenVINO CPU plugin tactics: record from the execution graph, replay through ``primitives_priority``.

**Record.** The compiled model's execution graph (``compiled.get_runtime_model()``) has one node per
kernel with rt_info ``primitiveType`` (``brgconv_avx512_f32``, ``jit_avx512_dw_f32``, ``brgemm_avx512_f32``,
``gemm_mlas_f32``, ``ref_any_f32``...), ``layerType``, ``runtimePrecision`` and ``originalLayersNames``.
The choice recorded is the primitive type without its precision suffix (``brgconv_avx512``), which is
the spelling the CPU plugin accepts back. Execution nodes are mapped to ONNX node names: the ONNX
frontend names each OpenVINO op after its ONNX node, adds suffixes for decompositions
(``conv0/WithoutBiases`` for a Conv with bias, whose bias ``Add`` keeps the name ``conv0``), and names
the producer of a graph output after the *output tensor* (a Softmax ``softmax`` writing graph output
``y`` becomes op ``y``); :func:`onnx_node_of` undoes all three with the ONNX file's names. When the CPU
plugin computes a graph output in another type than declared (int64 runs in i32, f64 in f32), its
ConvertPrecision appends ``.N`` to names: the Convert back to the declared type is ``y.0`` (or, for int64,
the computing node is ``y.0`` and the Convert ``y.0.0``). :func:`onnx_node_of` maps such names to the node
too, and where several execution nodes map to one ONNX node the one reached with the fewest ``.N``
suffixes removed stands for it (:func:`mapping_of`): the kernel computing the node, not the Convert back.

**Replay.** The CPU plugin honours the ``primitives_priority`` rt_info attribute only when it is an
``ov::PrimitivesPriority`` object, which the IR reader creates from
``<rt_info><attribute name="primitives_priority" version="0" value="cpu:<impl>"/></rt_info>`` in a
``<layer>`` of the IR XML; a plain string set from Python is neither honoured nor serialized (verified on
OpenVINO 2026.4.1). So :func:`pin_ir_xml` edits the XML of the model saved with ``openvino.save_model``.

Verified on this machine's CPU (AVX-512 with BF16, no AMX), OpenVINO 2026.4.1, f32 inference precision:
Convolution honours ``ref_any``, ``jit_avx512``, ``jit_avx512_dw``, ``jit_avx512_1x1``, ``jit_avx2`` (1x1)
and silently falls back for ``brgconv_avx512*`` (it builds ``jit_avx512*``) and ``jit_avx2`` on 3x3;
FullyConnected (MatMul with constant weights) builds ``jit_gemm`` for any priority except its own default
``brgemm_avx512``; ``gemm_mlas`` FullyConnected and ``Reduce`` keep their kernel whatever is asked; Softmax
honours ``ref_any``; an unknown name fails compilation ("Unsupported CPU implementation"). Because some
default kernels cannot be requested back, :func:`pins_for` pins only the choices that differ from the
unpinned build (which the plugin builds deterministically), and every replay is verified by re-recording.

Imports only the standard library at module level (it runs inside the OpenVINO worker); ``onnx`` is
imported lazily to read node names.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphbisect.tactics.record import TacticChoice, TacticRecord

__all__ = [
    "NodeNames",
    "impl_of",
    "ir_pins",
    "mapping_of",
    "onnx_names",
    "onnx_node_of",
    "pin_ir_xml",
    "pins_for",
    "priority_value",
    "record_from_exec_graph",
]

logger = logging.getLogger(__name__)

_PRECISION_SUFFIX = re.compile(r"_(?:f32|f16|bf16|i8|u8|i32|i64|fp32|fp16|undef|dynamic)$")
_NOT_KERNELS = {"Input", "Output", "Const", "Parameter", "Result"}
_SINK = "/sink_port_0"
_OUTPUT_INDEX = re.compile(r"\.\d+$")  # one ".N" that ConvertPrecision appended (see mapping_of)
_ATTRIBUTE = "primitives_priority"


@dataclass(frozen=True)
class NodeNames:
    """The ONNX model's node names and, for each tensor, the node producing it."""

    nodes: frozenset[str] = frozenset()
    producers: Mapping[str, str] = field(default_factory=dict)


def onnx_names(model_path: str | Path) -> NodeNames:
    """Node names of an ONNX file (weights not loaded). Empty when ``onnx`` is not importable here."""
    try:
        import onnx
    except ImportError:
        logger.warning("onnx is not importable in this interpreter: tactic records use OpenVINO layer names")
        return NodeNames()
    proto = onnx.load(str(model_path), load_external_data=False)
    producers = {out: node.name for node in proto.graph.node for out in node.output if out}
    return NodeNames(frozenset(node.name for node in proto.graph.node), producers)


def onnx_node_of(name: str, names: NodeNames) -> str | None:
    """The ONNX node an OpenVINO op or execution node name stands for (None: an inserted op).

    Tries the name, then shorter ``/``-prefixes (ONNX names may contain ``/``, OpenVINO appends
    ``/WithoutBiases`` and the like), each as a node name and then as an output tensor name; then the
    same without trailing ``.N`` suffixes (see :func:`mapping_of`).

    Example:
        >>> names = NodeNames(frozenset({"conv0", "softmax"}), {"y": "softmax"})
        >>> onnx_node_of("conv0/WithoutBiases", names), onnx_node_of("y", names), onnx_node_of("Reorder_3", names)
        ('conv0', 'softmax', None)
        >>> onnx_node_of("y.0", names), onnx_node_of("y.0.0", names), onnx_node_of("Convert_3.0", names)
        ('softmax', 'softmax', None)
    """
    return mapping_of(name, names)[0]


def mapping_of(name: str, names: NodeNames) -> tuple[str | None, int]:
    """:func:`onnx_node_of` and how many trailing ``.N`` suffixes were removed to find it.

    OpenVINO's ConvertPrecision, when a graph output ``s`` is computed in another type than declared,
    names the Convert back to the declared type ``<producer>.<output index>``: ``s.0`` after a Softmax
    ``s`` computing an f64 output in f32; for an int64 output (run in i32) the computing node itself
    becomes ``s.0`` and the Convert ``s.0.0``. Each lists only that name in ``originalLayersNames``. The
    exact name is tried first (an ONNX name may end in ``.0``), then one suffix less at a time; the count
    tells the computing kernel (fewest removed) from the Convert back when both map to one node.

    Example:
        >>> names = NodeNames(frozenset({"add"}), {"s": "add"})
        >>> mapping_of("s", names), mapping_of("s.0", names), mapping_of("s.0.0", names)
        (('add', 0), ('add', 1), ('add', 2))
    """
    if not names.nodes:
        return name, 0
    removed = 0
    while True:
        found = _by_name(name, names)
        if found is not None:
            return found, removed
        shorter = _OUTPUT_INDEX.sub("", name)
        if shorter == name or not shorter:
            return None, removed
        name, removed = shorter, removed + 1


def _by_name(name: str, names: NodeNames) -> str | None:
    """The node named ``name`` or a ``/``-prefix of it, as a node name or an output tensor name."""
    if name.endswith(_SINK):
        name = name[: -len(_SINK)]
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in names.nodes:
            return prefix
        if prefix in names.producers:
            return names.producers[prefix]
    return None


def impl_of(primitive_type: str) -> str:
    """The implementation name the CPU plugin accepts back: the primitive type without its precision.

    Example:
        >>> impl_of("brgconv_avx512_1x1_f32"), impl_of("ref_any_f32"), impl_of("jit_gemm")
        ('brgconv_avx512_1x1', 'ref_any', 'jit_gemm')
    """
    return _PRECISION_SUFFIX.sub("", primitive_type)


def priority_value(choice: str) -> str:
    """The ``primitives_priority`` attribute value that asks the CPU plugin for ``choice``."""
    return choice if choice.startswith("cpu:") else f"cpu:{choice}"


def record_from_exec_graph(
    exec_graph: Iterable[Mapping[str, Any]], names: NodeNames, *, version: str | None, device: str | None
) -> TacticRecord:
    """A tactic record from :func:`graphbisect.backends.openvino._exec_graph`'s node list.

    Only real kernels are recorded (not inputs, outputs, constants, or ``unknown_*`` no-op kernels such
    as Reshape), and only those that map to an ONNX node (inserted Reorders do not). One choice per ONNX
    node: where several kernels map to it, the one reached with the fewest ``.N`` suffixes removed
    (:func:`mapping_of`; an int64 output's MatMul ``s.0``, not the Convert back ``s.0.0``), the first
    in execution order among equals (a Convolution ``conv0/WithoutBiases`` before its bias ``conv0``).
    """
    best: dict[str, tuple[int, int, Mapping[str, Any]]] = {}  # ONNX node -> (suffixes removed, order, node)
    for order, node in enumerate(exec_graph):
        primitive = str(node.get("primitive_type") or "")
        if node.get("layer_type") in _NOT_KERNELS or not primitive or primitive.startswith("unknown"):
            continue
        onnx_node, removed = _onnx_node_for(node, names)
        if onnx_node is None:
            logger.debug("not recorded: execution node %s (%s) maps to no ONNX node", node.get("name"), primitive)
            continue
        if onnx_node in best and best[onnx_node][:2] <= (removed, order):
            logger.debug("not recorded: execution node %s (%s), another kernel stands for %s",
                         node.get("name"), primitive, onnx_node)
            continue
        best[onnx_node] = (removed, order, node)
    choices: list[TacticChoice] = []
    for onnx_node, (_, _, node) in sorted(best.items(), key=lambda item: item[1][1]):
        fused = tuple(dict.fromkeys(n for o in node.get("original_layers", ()) if (n := onnx_node_of(o, names))))
        choices.append(TacticChoice(
            node=onnx_node, choice=impl_of(str(node.get("primitive_type"))), layer=str(node.get("name")),
            layer_type=_opt(node.get("layer_type")), precision=_opt(node.get("runtime_precision")),
            fused=tuple(n for n in fused if n != onnx_node),
        ))
    return TacticRecord("openvino", version, device, tuple(choices))


def _onnx_node_for(node: Mapping[str, Any], names: NodeNames) -> tuple[str | None, int]:
    """The ONNX node an execution node's own name maps to, else its first original layer's (:func:`mapping_of`)."""
    own = mapping_of(str(node.get("name", "")), names)
    if own[0] is not None:
        return own
    return next((m for o in node.get("original_layers", ()) if (m := mapping_of(o, names))[0] is not None),
                (None, 0))


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def pins_for(wanted: TacticRecord, unpinned: TacticRecord) -> dict[str, str]:
    """``IR layer name -> choice`` for the nodes where ``wanted`` differs from the unpinned build.

    The layer is the one the unpinned build executed for that node (its execution node name is the
    OpenVINO op's friendly name, e.g. ``conv0/WithoutBiases``). Nodes the model does not have are skipped:
    a record of the full model applies to a reduced one.
    """
    current = unpinned.as_dict()
    pins: dict[str, str] = {}
    for choice in wanted.choices:
        have = current.get(choice.node)
        if have is None or have.choice == choice.choice or have.layer is None:
            continue
        pins[have.layer] = choice.choice
    return pins


_TYPE_ALIASES = {"fullyconnected": ("matmul",), "pooling": ("maxpool", "avgpool"), "softmax": ("softmax",)}


def _same_kind(exec_type: str | None, ir_type: str) -> bool:
    """Whether an execution node's layer type (``Convolution``, ``FullyConnected``) can be the IR op
    ``ir_type`` (``Convolution``/``GroupConvolution``, ``MatMul``)."""
    if not exec_type:
        return False
    want, have = exec_type.lower(), ir_type.lower()
    return want in have or any(alias in have for alias in _TYPE_ALIASES.get(want, ()))


def ir_pins(wanted: TacticRecord, unpinned: TacticRecord,
            ir_layers: Mapping[str, tuple[str, frozenset[str]]]) -> tuple[dict[str, str], list[str]]:
    """``IR layer -> choice`` for the nodes where ``wanted`` differs from the unpinned build, and the nodes
    no IR layer stands for.

    ``ir_layers`` maps each IR layer to its op type and the ONNX nodes it stands for (its own and its
    fused names). The layer is the one the unpinned build executed for the node when the IR has it by
    name (or without the ``.N`` suffixes the plugin appended, :func:`mapping_of`: execution layer ``s.0``
    is the op ``s`` as read); else the IR layer of a kind the kernel can be (``Convolution`` for a
    convolution kernel) that stands for the node: a Conv fused with its BatchNormalization runs as a layer
    the plugin created (``Multiply_14087``), recorded under the BatchNormalization node, and exists in the IR only once
    OpenVINO's common fusions have run (as a Convolution whose fused names hold both nodes).

    Example:
        >>> from graphbisect.tactics.record import TacticChoice, TacticRecord
        >>> bad = TacticRecord("openvino", None, None, (TacticChoice("bn", "jit_avx512", "Multiply_9"),))
        >>> good = TacticRecord("openvino", None, None, (TacticChoice("bn", "brgconv_avx512", "Multiply_7",
        ...                                                            "Convolution"),))
        >>> ir_pins(bad, good, {"Multiply_3": ("Convolution", frozenset({"conv", "bn"})),
        ...                     "bn": ("Add", frozenset({"bn"}))})
        ({'Multiply_3': 'jit_avx512'}, [])
    """
    current = unpinned.as_dict()
    pins: dict[str, str] = {}
    unmapped: list[str] = []
    for choice in wanted.choices:
        have = current.get(choice.node)
        if have is None or have.choice == choice.choice or have.layer is None:
            continue
        if have.layer in ir_layers:
            pins[have.layer] = choice.choice
            continue
        renamed = _ir_name(have.layer, ir_layers)
        if renamed is not None and choice.node in ir_layers[renamed][1]:
            pins[renamed] = choice.choice  # the plugin appended ".N" (mapping_of): the op as read is "s"
            continue
        layers = [name for name, (op_type, nodes) in ir_layers.items()
                  if choice.node in nodes and _same_kind(have.layer_type, op_type)]
        if not layers:
            unmapped.append(choice.node)
        for name in layers:
            pins[name] = choice.choice
    return pins, unmapped


def _ir_name(layer: str, ir_layers: Mapping[str, object]) -> str | None:
    """The IR layer named ``layer`` without trailing ``.N`` suffixes (the execution layer ``s.0`` of an int64
    output computed in i32 is the op ``s`` in the model as read), or None."""
    while (shorter := _OUTPUT_INDEX.sub("", layer)) != layer and shorter:
        if shorter in ir_layers:
            return shorter
        layer = shorter
    return None


def pin_ir_xml(xml_in: str | Path, xml_out: str | Path, pins: Mapping[str, str]) -> list[str]:
    """Copy an IR XML, adding ``primitives_priority`` to the layers named in ``pins``; returns missing names."""
    tree = ET.parse(str(xml_in))
    found: set[str] = set()
    for layer in tree.getroot().iter("layer"):
        name = layer.get("name") or ""
        if name not in pins:
            continue
        found.add(name)
        rt_info = layer.find("rt_info")
        if rt_info is None:
            rt_info = ET.SubElement(layer, "rt_info")
        for old in [a for a in rt_info.findall("attribute") if a.get("name") == _ATTRIBUTE]:
            rt_info.remove(old)
        ET.SubElement(rt_info, "attribute", {"name": _ATTRIBUTE, "version": "0", "value": priority_value(pins[name])})
    tree.write(str(xml_out), encoding="utf-8", xml_declaration=True)
    missing = sorted(set(pins) - found)
    if missing:
        logger.warning("no IR layer named %s: their tactics were not pinned", ", ".join(missing))
    return missing
