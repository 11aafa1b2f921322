"""Precision overrides in the formats other tools read, from one answer: which nodes stay FP32.

* ``overrides.json``: mode, nodes kept in FP32, lowered nodes, and every format below;
* trtexec: ``--precisionConstraints=obey --layerPrecisions=N:fp32,... --layerOutputTypes=N:fp32,...``
  (TensorRT's ONNX parser names layers after ONNX nodes; with ``--stronglyTyped`` use the typed
  mixed-precision ONNX model instead, whose Cast nodes carry the precision);
* onnxconverter-common ``float16.convert_float_to_float16(model, node_block_list=[...])``;
* ONNX Runtime quantization ``quantize_static(..., nodes_to_exclude=[...])``;
* Paddle Inference ``config.exp_disable_mixed_precision_ops({...})``: Paddle disables mixed precision per
  *op type*, not per node, so this is coarser (every node of those types stays FP32);
* OpenVINO: no per-node FP32 pin works from outside the CPU plugin (see ``OPENVINO_NOTE``); the emitted
  snippet marks nodes with the ``disable_fp16_compression`` runtime attribute, which OpenVINO's
  *compression to FP16* (``compress_to_fp16`` when saving IR, GPU) honours.

Example:
    >>> o = PrecisionOverrides("fp16", keep_fp32=("ln/Pow",), keep_op_types=("Pow",), lowered=("mm",))
    >>> o.trtexec()
    '--fp16 --precisionConstraints=obey --layerPrecisions=ln/Pow:fp32 --layerOutputTypes=ln/Pow:fp32'
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphbisect.artifacts.charts import ErrorPoint, error_chart_svg
from graphbisect.atomic import atomic_write_text

__all__ = ["OPENVINO_NOTE", "PrecisionOverrides", "sensitivity_chart_svg", "write_overrides"]

logger = logging.getLogger(__name__)

OPENVINO_NOTE = (
    "OpenVINO CPU: INFERENCE_PRECISION_HINT=f16/bf16 applies to the whole model; the CPU plugin offers no "
    "documented per-node FP32 pin. The rt_info attribute 'disable_fp16_compression' is honoured by "
    "OpenVINO's FP16 compression (compress_to_fp16 when saving IR, GPU plugin), not verified here on CPU. "
    "To pin nodes on any OpenVINO device, run the typed mixed-precision ONNX model with precision=f32."
)

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


@dataclass(frozen=True)
class PrecisionOverrides:
    """The answer of a precision search, ready to be written in several tools' formats."""

    mode: str
    keep_fp32: tuple[str, ...]
    keep_op_types: tuple[str, ...]
    lowered: tuple[str, ...]

    def trtexec(self) -> str:
        """trtexec flags pinning the nodes to FP32."""
        flag = _TRT_TYPES[self.mode]
        if not self.keep_fp32:
            return flag
        pins = ",".join(f"{name}:fp32" for name in self.keep_fp32)
        return f"{flag} --precisionConstraints=obey --layerPrecisions={pins} --layerOutputTypes={pins}"

    def paddle_ops(self) -> list[str]:
        """Paddle op types for ``exp_disable_mixed_precision_ops`` (coarser than per node)."""
        return sorted({_PADDLE_OPS.get(op, op.lower()) for op in self.keep_op_types})

    def snippets(self) -> dict[str, str]:
        """Python snippets for onnxconverter-common, ORT quantization, Paddle and OpenVINO."""
        names = json.dumps(list(self.keep_fp32))
        return {
            "onnxconverter_common": "from onnxconverter_common import float16\n"
            f"model16 = float16.convert_float_to_float16(model, keep_io_types=True, node_block_list={names})",
            "onnxruntime_quantization": "from onnxruntime.quantization import quantize_static, QuantFormat\n"
            f"quantize_static(fp32_path, int8_path, reader, quant_format=QuantFormat.QDQ, nodes_to_exclude={names})",
            "paddle": f"config.enable_use_gpu(256, 0, PrecisionType.Half)\n"
            f"config.exp_disable_mixed_precision_ops(set({json.dumps(self.paddle_ops())}))",
            "openvino": "import openvino as ov\nmodel = ov.Core().read_model(onnx_path)\n"
            f"pins = set({names})\nfor op in model.get_ops():\n"
            "    if op.get_friendly_name() in pins:\n"
            "        op.get_rt_info()['disable_fp16_compression_0'] = ''\n"
            "# honoured by FP16 compression (ov.save_model(..., compress_to_fp16=True), GPU); see note",
        }

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "keep_fp32": list(self.keep_fp32), "lowered": list(self.lowered),
                "trtexec": self.trtexec(), "onnxconverter_common_node_block_list": list(self.keep_fp32),
                "onnxruntime_nodes_to_exclude": list(self.keep_fp32),
                "paddle_exp_disable_mixed_precision_ops": self.paddle_ops(),
                "openvino": {"note": OPENVINO_NOTE, "rt_info_pins": list(self.keep_fp32)},
                "snippets": self.snippets()}


def write_overrides(overrides: PrecisionOverrides, folder: Path) -> list[Path]:
    """Write ``overrides.json``, ``trtexec.txt`` and ``snippets.py`` into ``folder``; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "overrides.json", folder / "trtexec.txt", folder / "snippets.py"]
    atomic_write_text(paths[0], json.dumps(overrides.to_json(), indent=2) + "\n")
    atomic_write_text(paths[1], overrides.trtexec() + "\n")
    atomic_write_text(paths[2], "\n\n".join(f"# --- {k}\n{v}" for k, v in overrides.snippets().items()) + "\n")
    return paths


def sensitivity_chart_svg(rows: Sequence[tuple[int, str, float, bool]], mode: str) -> str:
    """Per-node sensitivity chart: ``(position, node, score, breaks_alone)``, score = output error in
    tolerances with only that node lowered; the nodes that break the tolerance alone are labelled."""
    points = [ErrorPoint(pos, name, score, "first" if breaks else None) for pos, name, score, breaks in rows]
    return error_chart_svg(points, title=f"output error with only this node in {mode} (in tolerances)")
