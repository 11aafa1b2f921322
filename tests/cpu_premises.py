"""Backend behaviours that only some CPUs show, checked by running the real backend (no mocks).

A test whose premise is one of these asks here, keeps its full assertions where the premise holds, and skips
(or asserts the other, legitimate path) where it does not, with a reason naming the behaviour, the evidence and
the CPU feature behind it. Each check runs once per process.

:func:`openvino_dynamic_quantization`
    OpenVINO's CPU plugin quantizes the *activations* of an int8-weight FullyConnected to i8 at run time
    (``DYNAMIC_QUANTIZATION_GROUP_SIZE``, default 32) only where its oneDNN FullyConnected executor finds
    AVX2-VNNI or AVX512-VNNI (``mayiuse(avx2_vnni) || mayiuse(avx512_core_vnni)``); elsewhere it decompresses
    the weights and computes in f32 whatever the group size (kernel ``brgemm_avx2_f32`` on an AVX2-only CPU).
    Checked on :func:`~graphbisect.examples.quantized.int8_weight_model`: the default compiled model against
    one compiled with group size 0, where dynamic quantization puts the outputs ~0.1 apart and f32 leaves them
    identical.
:func:`onnxruntime_nchwc_block_size`
    ONNX Runtime's NchwcTransformer (``opt_level=all``) blocks the channels of a Conv by MLAS's NCHWc block
    size: 16 with AVX-512F, 8 with AVX2 only, none (1) without either. Which Convs qualify, and so which
    tensors stay only in the blocked layout between two NCHWc nodes, depends on it.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DynamicQuantization", "cpu_flags", "onnxruntime_nchwc_block_size", "openvino_dynamic_quantization",
           "require_openvino_dynamic_quantization"]

#: /proc/cpuinfo flags of the integer dot-product instructions OpenVINO's dynamic quantization needs (AMX listed
#: for the record: an AMX CPU has AVX512-VNNI too).
VNNI_FLAGS = ("avx_vnni", "avx512_vnni", "amx_int8")

#: Outputs of the default and the group-size-0 compiled model further apart than this: the activations were
#: quantized (~0.1 on int8_weight_model); f32 both ways leaves them identical (at most float reordering, 1e-5).
_QUANTIZED_APART = 1e-3


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (empty where ``/proc/cpuinfo`` is not there)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _vnni_text() -> str:
    present = [flag for flag in VNNI_FLAGS if flag in cpu_flags()]
    return (f"this CPU has {', '.join(present)}" if present
            else f"this CPU has none of the flags {', '.join(VNNI_FLAGS)}")


@dataclass(frozen=True)
class DynamicQuantization:
    """What OpenVINO's CPU plugin did with int8_weight_model's FullyConnected, default against group size 0."""

    active: bool
    #: max |default - group size 0| over the output
    apart: float
    #: the FullyConnected's ``primitiveType`` in the default compiled model (e.g. ``brgemm_avx2_f32``)
    kernel: str
    group_size: str
    version: str

    @property
    def reason(self) -> str:
        """Why a test that needs the dynamic quantization cannot show it here (the skip reason)."""
        return (f"OpenVINO {self.version} does not quantize the activations of an int8-weight FullyConnected "
                f"on this CPU: with the default DYNAMIC_QUANTIZATION_GROUP_SIZE={self.group_size} it ran kernel "
                f"{self.kernel} and its output is {self.apart:.3g} (max abs) from group size 0's, f32 both ways; its "
                f"dynamic quantization needs AVX2-VNNI or AVX512-VNNI and {_vnni_text()}")


@functools.cache
def openvino_dynamic_quantization() -> DynamicQuantization:
    """Run OpenVINO (CPU) on int8_weight_model by default and with ``DYNAMIC_QUANTIZATION_GROUP_SIZE=0``."""
    import onnx
    import openvino as ov

    from graphbisect.examples.quantized import int8_weight_model

    model, inputs = int8_weight_model()
    core = ov.Core()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "int8_weights.onnx"
        onnx.save(model, path)
        # f32 as graphbisect's openvino backend asks (its default precision=f32): a CPU with AMX-BF16 would
        # otherwise compile in bf16 (brgemm_avx512_amx_bf16), where nothing is quantized either way
        f32 = {"INFERENCE_PRECISION_HINT": "f32"}
        default = core.compile_model(core.read_model(str(path)), "CPU", f32)
        plain = core.compile_model(core.read_model(str(path)), "CPU", {**f32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
        apart = float(np.abs(np.asarray(default(inputs)[0]) - np.asarray(plain(inputs)[0])).max())
    kernels = [op.get_rt_info()["primitiveType"].astype(str) for op in default.get_runtime_model().get_ordered_ops()
               if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    return DynamicQuantization(active=apart > _QUANTIZED_APART, apart=apart, kernel=", ".join(kernels) or "none",
                               group_size=str(default.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")),
                               version=ov.get_version().split("-")[0])


def require_openvino_dynamic_quantization() -> None:
    """Skip the calling test where OpenVINO does not quantize int8-weight FullyConnected activations."""
    import pytest

    premise = openvino_dynamic_quantization()
    if not premise.active:
        pytest.skip(premise.reason)


def _nchwc_weight_rows(channels: int) -> int:
    """The output channels of the NCHWc Conv ONNX Runtime (``all``) builds for one 3x3 Conv of ``channels`` in
    and out, padded to MLAS's block (0: no NCHWc Conv)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weights = np.ones((channels, channels, 3, 3), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "nchwc_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        options.log_severity_level = 3  # its warning that the saved NCHWc model is CPU-specific
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    blocked = [node for node in optimized.graph.node if node.domain == "com.microsoft.nchwc" and node.op_type == "Conv"]
    if not blocked:
        return 0
    weights = {t.name: t for t in optimized.graph.initializer}
    return int(weights[blocked[0].input[1]].dims[0])


@functools.cache
def onnxruntime_nchwc_block_size() -> int:
    """MLAS's NCHWc block size as ONNX Runtime applies it: 8 (AVX2 only) or 16 (AVX-512F), read from the rows an
    8-channel Conv's weights are padded to (a Conv whose input has fewer channels than a block still becomes NCHWc,
    reading NCHW: counting blocked Convs cannot tell the two apart); 1 where there are no NCHWc kernels."""
    return _nchwc_weight_rows(8) or 1
