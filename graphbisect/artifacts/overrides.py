"""Precision overrides in the formats other tools read, from one answer: which nodes stay FP32.

* ``overrides.json``: mode, nodes kept in FP32, lowered nodes, and every format below;
* trtexec: ``--precisionConstraints=obey --layerPrecisions=N:fp32,... --layerOutputTypes=N:fp32,...``
  (TensorRT's ONNX parser names layers after ONNX nodes; with ``--stronglyTyped`` use the typed
  mixed-precision ONNX model instead, whose Cast nodes carry the precision);
* onnxconverter-common ``float16.convert_float_to_float16(model, node_block_list=[...])``;
* ONNX Runtime quantization ``quantize_static(..., nodes_to_exclude=[...])`` with the quantization the int8 search
  measured (:meth:`PrecisionOverrides.onnxruntime_quantization`): QDQ, uint8 activations, int8 weights *per
  channel*, the same calibration method and op types. It said per tensor before (ORT's default), a coarser
  quantization than the one verified: on a MatMul whose weight columns differ 50× in magnitude the snippet's
  model missed the tolerance the answer met (issue 35);
* Paddle Inference ``config.exp_disable_mixed_precision_ops({...})``: Paddle disables mixed precision per
  *op type*, not per node, so this is coarser (every node of those types stays FP32). That is Paddle's GPU
  mixed precision: on CPU it does nothing to oneDNN bf16 (measured, Paddle 3.3.1: a legacy MobileNetV2
  with ``exp_disable_mixed_precision_ops({"fused_conv2d"})`` gives the same bf16 outputs as without);
* Paddle Inference CPU bf16, when the search ran on Paddle itself (``unit="paddle_op_type"``: the answer
  is a set of Paddle op types): ``config.enable_mkldnn_bfloat16()`` + ``config.set_bfloat16_op({...})`` with
  the op types that may run in bf16 (:meth:`PrecisionOverrides.paddle_cpu_bf16`); the node formats
  (trtexec, onnxconverter-common, ORT, OpenVINO) do not apply to op types and are left out;
* OpenVINO (fp16/bf16): the nodes' ops marked with OpenVINO's ``DisablePrecisionConversion`` runtime
  attribute, which the CPU plugin honours per node under ``INFERENCE_PRECISION_HINT=bf16|f16``; the
  snippet does what ``openvino:keep_fp32=`` does (fuse with the common transformations, mark the fused
  ops in the IR XML, read it back; see :mod:`graphbisect.backends.openvino` and ``OPENVINO_NOTE``) and
  is run by the tests. Equivalently: ``--target openvino:precision=bf16,keep_fp32=@keep_fp32.txt``.
  INT8 (OpenVINO quantizes with NNCF): an ``nncf.IgnoredScope`` of the nodes, not run here.

Example:
    >>> o = PrecisionOverrides("fp16", keep_fp32=("ln/Pow",), keep_op_types=("Pow",), lowered=("mm",))
    >>> o.trtexec()
    '--fp16 --precisionConstraints=obey --layerPrecisions=ln/Pow:fp32 --layerOutputTypes=ln/Pow:fp32'
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphbisect.artifacts.charts import ErrorPoint, error_chart_svg
from graphbisect.storage.atomic import atomic_write_text
from graphbisect.text.printable import shown

__all__ = ["OPENVINO_NOTE", "PrecisionOverrides", "sensitivity_chart_svg", "trtexec_cannot_name", "write_overrides"]

logger = logging.getLogger(__name__)

OPENVINO_NOTE = (
    "OpenVINO CPU: the snippet marks the ops of these nodes with DisablePrecisionConversion, which the CPU plugin "
    "honours per node under INFERENCE_PRECISION_HINT=bf16|f16 (verified on OpenVINO 2026.4 against the execution "
    "graph's runtime precision). The mark is not copied by the plugin's own rewrites: a MatMul with a bias Add "
    "(FullyConnected) or an attention block (ScaledDotProductAttention) runs in reduced precision anyway; "
    "graphbisect's openvino backend reports such nodes as keep_fp32.not_applied."
)

_OPENVINO_PINS = """\
# The ONNX nodes to keep in FP32; everything else runs at INFERENCE_PRECISION_HINT={hint} on the CPU.
# Needs onnx_path (the model graphbisect searched); writes ir_path (+ .bin) with the pins, compiles it.
import xml.etree.ElementTree as ET

import onnx
import openvino as ov
from openvino._offline_transformations import apply_moc_transformations

keep_fp32 = set({names})
ir_path = "keep_fp32.xml"
graph = onnx.load(onnx_path, load_external_data=False).graph
nodes = {{node.name for node in graph.node}}
producer = {{out: node.name for node in graph.node for out in node.output}}


def onnx_node(op_name):
    # OpenVINO ops are named after their ONNX node, with /suffixes, or after a graph output tensor.
    parts = op_name.removesuffix("/sink_port_0").split("/")
    for end in range(len(parts), 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in nodes or prefix in producer:
            return prefix if prefix in nodes else producer[prefix]
    return None


core = ov.Core()
model = core.read_model(onnx_path)
apply_moc_transformations(model, cf=False)  # fuse first: an op made by a fusion does not inherit the mark
pinned = set()
for op in model.get_ops():
    if op.get_type_name() in ("Parameter", "Result", "Constant"):
        continue
    rt_info = op.get_rt_info()
    fused = rt_info["fused_names_0"].astype(str).split(",") if "fused_names_0" in rt_info else []
    if any(onnx_node(name) in keep_fp32 for name in [op.get_friendly_name(), *fused]):
        pinned.add(op.get_friendly_name())
ov.save_model(model, ir_path, compress_to_fp16=False)
tree = ET.parse(ir_path)  # the mark is a typed attribute only the IR reader creates, so edit the XML
for layer in tree.getroot().iter("layer"):
    if layer.get("name") in pinned:
        rt = layer.find("rt_info")
        rt = ET.SubElement(layer, "rt_info") if rt is None else rt
        ET.SubElement(rt, "attribute", {{"name": "DisablePrecisionConversion", "version": "0",
                                         "value": "dynamic:dynamic"}})
tree.write(ir_path)
compiled = core.compile_model(ir_path, "CPU", {{"INFERENCE_PRECISION_HINT": "{hint}"}})
"""

_OPENVINO_INT8 = """\
# OpenVINO quantizes with NNCF (not run by graphbisect): leave these nodes in FP32.
import nncf
quantized = nncf.quantize(ov_model, calibration_dataset, ignored_scope=nncf.IgnoredScope(names={names}))
"""

_PADDLE_OPS = {
    "Conv": "conv2d", "ConvTranspose": "conv2d_transpose", "MatMul": "matmul_v2", "Gemm": "matmul_v2",
    "Add": "elementwise_add", "Sub": "elementwise_sub", "Mul": "elementwise_mul", "Div": "elementwise_div",
    "Pow": "elementwise_pow", "Sqrt": "sqrt", "ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum",
    "Softmax": "softmax", "LayerNormalization": "layer_norm", "BatchNormalization": "batch_norm",
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log",
    "HardSwish": "hard_swish", "HardSigmoid": "hard_sigmoid", "GlobalAveragePool": "pool2d",
    "AveragePool": "pool2d", "MaxPool": "pool2d", "Clip": "clip", "Resize": "bilinear_interp_v2",
}

_TRT_TYPES = {"fp16": "--fp16", "bf16": "--bf16", "int8": "--int8"}


def trtexec_cannot_name(name: str) -> bool:
    """Whether trtexec's ``--layerPrecisions``/``--layerOutputTypes`` cannot name the layer ``name``.

    TensorRT's ``samples/common/sampleOptions.cpp`` splits the list at every ``,`` (with no quoting), reads a
    ``'`` as the start of its ``'name':value`` form, takes ``*`` as every layer, and splits a pair at its
    **last** ``:``, so ``a:b:fp32`` pins ``a:b`` (a ``:`` in a name is fine). A node named ``a,b`` became two
    entries, ``a`` (no precision: trtexec refuses the line) and ``b:fp32``, a pin of another layer (issue 36
    item 6).

    Example:
        >>> [trtexec_cannot_name(n) for n in ("ln/Pow", "a:b", "a,b", "it's", "*", "")]
        [False, False, True, True, True, True]
    """
    return not name or name == "*" or "," in name or "'" in name


@dataclass(frozen=True)
class PrecisionOverrides:
    """The answer of a precision search, ready to be written in several tools' formats."""

    mode: str
    keep_fp32: tuple[str, ...]
    keep_op_types: tuple[str, ...]
    lowered: tuple[str, ...]
    #: What ``keep_fp32``/``lowered`` name: ONNX ``node`` names, or ``paddle_op_type`` (a search on Paddle).
    unit: str = "node"
    #: int8: nodes the lowering kept in float in every run, not searched (a bias beyond int32); the int8 formats
    #: (ORT, NNCF, trtexec) keep them out of int8 as well, since no run measured them quantized.
    float_nodes: tuple[str, ...] = ()
    #: int8: the calibration method the search used (``minmax``, ``percentile``, ``entropy``).
    calibration: str = "minmax"
    #: int8: the op types the search quantizes (:data:`graphbisect.precision.modes.INT8_OPS`); empty: ORT's own.
    int8_op_types: tuple[str, ...] = ()

    @property
    def pinned_fp32(self) -> tuple[str, ...]:
        """The nodes the formats keep out of reduced precision: ``keep_fp32``, then ``float_nodes``."""
        return tuple(dict.fromkeys((*self.keep_fp32, *self.float_nodes)))

    def onnxruntime_quantization(self) -> str:
        """``quantize_static`` with the quantization the int8 search measured (graphbisect.precision.qdq).

        Example:
            >>> print(PrecisionOverrides("int8", ("fc",), ("Gemm",), ("conv",), int8_op_types=("Conv", "Gemm"))
            ...       .onnxruntime_quantization())  # doctest: +NORMALIZE_WHITESPACE
            from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
            # graphbisect's int8: QDQ, uint8 activations per tensor (asymmetric), int8 weights per output channel
            # (symmetric), int32 biases; calibration: the inputs `reader` yields
            quantize_static(fp32_path, int8_path, reader, quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=["Conv", "Gemm"],
                            nodes_to_exclude=["fc"],
                            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        """
        method, extra, note = "MinMax", "", ""
        if self.calibration == "percentile":
            method, extra = "Percentile", ', "CalibPercentile": 99.99'
        elif self.calibration == "entropy":
            method = "Entropy"
        if self.calibration in ("percentile", "entropy"):
            note = (f"\n# ORT's {method} calibrator computes its ranges from its own histograms: close to "
                    "graphbisect's, not the same (MinMax ranges are)")
        ops = f" op_types_to_quantize={json.dumps(list(self.int8_op_types))}," if self.int8_op_types else ""
        return ("from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static\n"
                "# graphbisect's int8: QDQ, uint8 activations per tensor (asymmetric), int8 weights per output "
                "channel\n# (symmetric), int32 biases; calibration: the inputs `reader` yields" + note + "\n"
                "quantize_static(fp32_path, int8_path, reader, quant_format=QuantFormat.QDQ, per_channel=True,\n"
                "                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,\n"
                f"                calibrate_method=CalibrationMethod.{method},{ops}\n"
                f"                nodes_to_exclude={json.dumps(list(self.pinned_fp32))},\n"
                '                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True'
                f"{extra}}})")

    def paddle_cpu_bf16(self) -> str:
        """Paddle Inference config lines for CPU bf16 with the kept op types in FP32 (``unit="paddle_op_type"``).

        Example:
            >>> print(PrecisionOverrides("bf16", ("fused_conv2d",), ("fused_conv2d",), ("fc", "pool2d"),
            ...                          unit="paddle_op_type").paddle_cpu_bf16())
            config.enable_mkldnn()
            config.enable_mkldnn_bfloat16()
            config.set_bfloat16_op({"fc", "pool2d"})  # fused_conv2d stays FP32
        """
        if not self.lowered:
            return "config.enable_mkldnn()  # every op type stays FP32: do not enable bf16"
        allowed = ", ".join(json.dumps(name) for name in self.lowered)
        kept = f"  # {', '.join(self.keep_fp32)} stay{'s' if len(self.keep_fp32) == 1 else ''} FP32" \
            if self.keep_fp32 else ""
        return f"config.enable_mkldnn()\nconfig.enable_mkldnn_bfloat16()\nconfig.set_bfloat16_op({{{allowed}}}){kept}"

    def trtexec(self) -> str:
        """trtexec flags pinning the nodes to FP32, shell-quoted (node names may hold spaces, quotes, ``$``);
        the nodes trtexec cannot name (:attr:`trtexec_left_out`) are not in them.

        Example:
            >>> PrecisionOverrides("fp16", ("a,b", "c:d"), (), ()).trtexec()
            '--fp16 --precisionConstraints=obey --layerPrecisions=c:d:fp32 --layerOutputTypes=c:d:fp32'
        """
        flag = _TRT_TYPES[self.mode]
        named = [name for name in self.pinned_fp32 if name not in self.trtexec_left_out]
        if not named:
            return flag
        pins = shlex.quote(",".join(f"{name}:fp32" for name in named))
        return f"{flag} --precisionConstraints=obey --layerPrecisions={pins} --layerOutputTypes={pins}"

    @property
    def trtexec_left_out(self) -> tuple[str, ...]:
        """The FP32 nodes trtexec's ``--layerPrecisions`` list cannot name (:func:`trtexec_cannot_name`)."""
        return tuple(name for name in self.pinned_fp32 if trtexec_cannot_name(name))

    def trtexec_note(self) -> str | None:
        """What the trtexec line leaves out and where those nodes are instead; None when it names every node."""
        left = self.trtexec_left_out
        if not left:
            return None
        return (f"trtexec cannot name {len(left)} of the {len(self.pinned_fp32)} FP32 node(s) in --layerPrecisions "
                f"(it splits the list at ',' with no quoting, a quote starts its own quoted form, '*' means every "
                f"layer): {', '.join(shown(n) for n in left)}. trtexec.txt leaves them out, so TensorRT may lower "
                "them; pin them by their TensorRT layer names, or use the typed mixed-precision model with "
                "--stronglyTyped. overrides.json, keep_fp32.txt and the snippets keep every node.")

    def openvino_target(self, pin_file: Path | str = "/abs/path/keep_fp32.txt") -> str | None:
        """The graphbisect target spec that runs these pins from ``pin_file`` (None for int8).

        Example:
            >>> PrecisionOverrides("bf16", ("ln/Pow",), ("Pow",), ()).openvino_target("/o/keep_fp32.txt")
            'openvino:precision=bf16,keep_fp32=@/o/keep_fp32.txt'
        """
        if self.mode == "int8":
            return None
        return f"openvino:precision={'f16' if self.mode == 'fp16' else 'bf16'},keep_fp32=@{pin_file}"

    def paddle_ops(self) -> list[str]:
        """Paddle op types for ``exp_disable_mixed_precision_ops`` (coarser than per node)."""
        return sorted({_PADDLE_OPS.get(op, op.lower()) for op in self.keep_op_types})

    def snippets(self) -> dict[str, str]:
        """Python snippets for onnxconverter-common, ORT quantization (int8), Paddle and OpenVINO (op types:
        Paddle's)."""
        if self.unit == "paddle_op_type":
            return {"paddle_cpu_bf16": self.paddle_cpu_bf16()}
        names = json.dumps(list(self.keep_fp32))
        # ORT's quantizer only for an int8 answer: an fp16/bf16 search measured no int8 quantization
        ort_int8 = {"onnxruntime_quantization": self.onnxruntime_quantization()} if self.mode == "int8" else {}
        return {
            "onnxconverter_common": "from onnxconverter_common import float16\n"
            f"model16 = float16.convert_float_to_float16(model, keep_io_types=True, node_block_list={names})",
            **ort_int8,
            "paddle": f"config.enable_use_gpu(256, 0, PrecisionType.Half)\n"
            f"config.exp_disable_mixed_precision_ops(set({json.dumps(self.paddle_ops())}))",
            "openvino": self.openvino(),
        }

    def openvino(self) -> str:
        """The OpenVINO snippet: per-node FP32 pins for fp16/bf16 (defines ``compiled``), NNCF's for int8."""
        if self.mode == "int8":
            return _OPENVINO_INT8.format(names=json.dumps(list(self.pinned_fp32)))
        names = json.dumps(list(self.keep_fp32))
        return _OPENVINO_PINS.format(names=names, hint="f16" if self.mode == "fp16" else "bf16")

    def to_json(self, pin_file: Path | None = None) -> dict[str, object]:
        """Everything in one JSON object; ``pin_file``: where ``keep_fp32.txt`` was written."""
        if self.unit == "paddle_op_type":
            target = f"paddle:precision=bf16,keep_fp32=@{pin_file or '/abs/path/keep_fp32.txt'}"
            return {"mode": self.mode, "unit": self.unit, "keep_fp32": list(self.keep_fp32),
                    "lowered": list(self.lowered), "paddle_set_bfloat16_op": list(self.lowered),
                    "paddle_config": self.paddle_cpu_bf16(), "paddle_target": target, "snippets": self.snippets()}
        return {"mode": self.mode, "keep_fp32": list(self.keep_fp32), "lowered": list(self.lowered),
                "trtexec": self.trtexec(), "trtexec_left_out": list(self.trtexec_left_out),
                "trtexec_note": self.trtexec_note(), "onnxconverter_common_node_block_list": list(self.keep_fp32),
                "onnxruntime_nodes_to_exclude": list(self.pinned_fp32), "int8_float_nodes": list(self.float_nodes),
                "paddle_exp_disable_mixed_precision_ops": self.paddle_ops(),
                "openvino": {"note": OPENVINO_NOTE, "keep_fp32": list(self.keep_fp32),
                             "target": self.openvino_target(pin_file) if pin_file else self.openvino_target()},
                "snippets": self.snippets()}


def write_overrides(overrides: PrecisionOverrides, folder: Path) -> list[Path]:
    """Write ``overrides.json``, ``snippets.py``, ``keep_fp32.txt`` (one name per line, what
    ``openvino:keep_fp32=@FILE`` / ``paddle:keep_fp32=@FILE`` read) and ``trtexec.txt`` (nodes) or
    ``paddle_config.txt`` (Paddle op types) into ``folder``; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    pin_file = folder / "keep_fp32.txt"
    paths = [folder / "overrides.json", folder / "snippets.py", pin_file]
    atomic_write_text(paths[0], json.dumps(overrides.to_json(pin_file.resolve()), indent=2) + "\n")
    atomic_write_text(paths[1], "\n\n".join(f"# --- {k}\n{v}" for k, v in overrides.snippets().items()) + "\n")
    atomic_write_text(pin_file, "".join(f"{name}\n" for name in overrides.keep_fp32))
    if overrides.unit == "paddle_op_type":  # op types: Paddle's config lines, no per-node formats
        paths.append(folder / "paddle_config.txt")
        atomic_write_text(paths[-1], overrides.paddle_cpu_bf16() + "\n")
    else:
        paths.append(folder / "trtexec.txt")
        atomic_write_text(paths[-1], overrides.trtexec() + "\n")
        note = overrides.trtexec_note()
        if note is not None:
            logger.warning("%s", note)
    return paths


def sensitivity_chart_svg(rows: Sequence[tuple[int, str, float, bool]], mode: str) -> str:
    """Per-node sensitivity chart: ``(position, node, score, breaks_alone)``, score = output error in
    tolerances with only that node lowered; the nodes that break the tolerance alone are labelled."""
    points = [ErrorPoint(pos, name, score, "first" if breaks else None) for pos, name, score, breaks in rows]
    return error_chart_svg(points, title=f"output error with only this node in {mode} (in tolerances)")
