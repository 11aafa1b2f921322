"""A stand-in for a GPU target's TF32 kernels, on the CPU: ONNX Runtime with every MatMul/Gemm/Conv weight
rounded to TF32 (a 10-bit mantissa, round to nearest even) before the session is built.

Why it exists: ONNX Runtime's CUDA execution provider computes MatMul and Conv in TF32 by default
(``cuda.use_tf32``), so on a GPU every matrix product differs from the CPU's by about 1e-3 relative — often a
few times the tolerance. That error is the target's **noise floor**: it is there with every optimization
off, and a tool that reduces "the first failing node" reduces it instead of the user's bug (issue 23:
``reduce --example`` on an H100 returned ``/embed/MatMul`` at 2.1× tolerance, where the model fails at ~1e3×
in a mis-fused LayerNorm). This runtime reproduces that situation on any machine: it *is* ONNX Runtime (same
options, optimizations, saved optimized model, passes), plus the rounding, which it applies at every
optimization level — ``tf32ort:opt_level=disable`` is its noise floor, as ``providers=CUDAExecutionProvider,
opt_level=disable`` is the CUDA EP's.

It is a **stand-in**, named as such: it emulates only the rounding of weights, not TF32's rounding of
activations inside the kernel. Tests and benchmarks register it with :func:`register`::

    >>> from graphbisect.examples.tf32_target import register     # doctest: +SKIP
    >>> register(); graphbisect.reduce(model, "out", target="tf32ort:opt_level=all")   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from graphbisect.backends.onnxruntime import OnnxRuntime, create_session

__all__ = ["NAME", "Tf32OnnxRuntime", "register", "round_tf32"]

log = logging.getLogger(__name__)

#: The name it is registered under.
NAME = "tf32ort"
#: Ops whose weight inputs (initializers) a TF32 GPU kernel reads at TF32 precision.
_TF32_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def round_tf32(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10-bit mantissa, to nearest even (NaN/Inf kept).

    Example:
        >>> float(round_tf32(np.array([1 + 2**-11], np.float32))[0])   # a tie rounds to the even mantissa
        1.0
        >>> float(round_tf32(np.array([1 + 3 * 2**-11], np.float32))[0]) == 1 + 2**-9
        True
    """
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    keep = (bits >> np.uint32(13)) & np.uint32(1)  # the last kept mantissa bit: ties go to even
    rounded = (bits + np.uint32(0xFFF) + keep) & np.uint32(0xFFFFE000)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    return np.where(finite, rounded, bits).view(np.float32)


class Tf32OnnxRuntime(OnnxRuntime):
    """ONNX Runtime with MatMul/Gemm/Conv weights rounded to TF32 (a stand-in for a GPU's TF32 kernels)."""

    name: ClassVar[str] = NAME

    def _create(self, model: str, so: Any) -> Any:
        import onnx
        from onnx import numpy_helper

        proto = onnx.load(model)  # external data read from the model's folder
        weights = {name for node in proto.graph.node if node.op_type in _TF32_OPS for name in node.input[1:2]}
        for index, tensor in enumerate(proto.graph.initializer):
            if tensor.name in weights and tensor.data_type == onnx.TensorProto.FLOAT:
                rounded = numpy_helper.from_array(round_tf32(numpy_helper.to_array(tensor)), tensor.name)
                proto.graph.initializer[index].CopyFrom(rounded)
        return create_session(self._ort, proto.SerializeToString(), so, self.options, self.options.disabled)


def register() -> None:
    """Add ``tf32ort`` to this process's backend table: ONNX Runtime's row (options, optimization levels,
    compiled-graph description, passes) with this runtime. Idempotent."""
    import dataclasses

    from graphbisect.backends import registry

    ort = registry.get("onnxruntime")
    row = dataclasses.replace(
        ort, name=NAME, aliases=(), runtime=f"{__name__}:Tf32OnnxRuntime", family=ort.name,
        summary="stand-in: ONNX Runtime with MatMul/Gemm/Conv weights rounded to TF32 (a GPU's TF32 kernels)")
    registry.register_row(row)
