"""onnx.reference's Cast/CastLike to bfloat16 rounded to nearest even, where the installed onnx truncates.

onnx 1.17 and 1.18's reference keeps the upper 16 bits of a float32; ONNX's own converter
(``onnx.helper.float32_to_bfloat16``), onnx 1.19's reference, ONNX Runtime, OpenVINO and ml_dtypes round to
nearest even (:mod:`graphbisect.backends.reference` says why graphbisect follows them). :func:`rounding_casts`
probes the installed onnx with one cast and returns ``new_ops`` overrides for ``ReferenceEvaluator`` only where
it truncates.

**Standalone on purpose:** numpy and onnx only, no graphbisect import and no other module state. ``repro.py``'s
``reference`` section embeds this file's text (``embedded_source``), so a bundle's script runs exactly the
evaluator graphbisect ran, on whichever onnx the reader has.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A float32 whose bfloat16 differs by rounding mode: 0x3EF5 truncated, 0x3EF6 rounded to nearest even.
ROUNDS_UP = np.array([0.48033667], np.float32)


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (``uint16``) of ``x`` rounded to nearest even, through float32 — the rounding of
    ``onnx.helper.float32_to_bfloat16``, vectorized: NaN becomes the quiet NaN ``0x7FC0``.

    Example:
        >>> bfloat16_bits(np.array([0.48033667, 1.0, np.inf, np.nan], np.float32)).tolist()
        [16118, 16256, 32640, 32704]
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    return np.where(np.isnan(x.astype(np.float32)), np.uint32(0x7FC0), rounded).astype(np.uint16)


def rounding_casts() -> tuple[list[type], list[str]]:
    """(``new_ops`` classes, what they change) for the installed onnx: none when its reference already rounds."""
    from onnx import TensorProto
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops import op_cast, op_cast_like

    bf16 = TensorProto.BFLOAT16
    got = np.asarray(op_cast.cast_to(ROUNDS_UP, bf16, True)).view(np.uint16)
    if int(got[0]) != int(ROUNDS_UP.view(np.uint32)[0] >> 16):
        return [], []
    storage = np.dtype(getattr(op_cast, "bfloat16", np.uint16))  # onnx < 1.19: its own structured bfloat16

    def rounded(x: np.ndarray) -> np.ndarray | None:
        """``x`` as bfloat16, rounded to nearest even; None for what onnx's own cast must do (strings,
        onnx's structured float8/int4 values)."""
        return None if x.dtype.kind not in "biuf" else bfloat16_bits(x).view(storage)

    class Cast(OpRun):
        op_domain = ""

        def _run(self, x: np.ndarray, to: int | None = None, saturate: int | None = None) -> tuple[np.ndarray]:
            y = rounded(x) if to == bf16 else None
            return (op_cast.cast_to(x, to, 1 if saturate is None else saturate) if y is None else y,)

    classes: list[type] = [Cast]
    cast_like: Any = getattr(op_cast_like, "_cast_like", None)
    if cast_like is not None:
        class CastLike(OpRun):
            op_domain = ""

            def _run(self, x: np.ndarray, y: np.ndarray, saturate: int | None = None) -> tuple[np.ndarray]:
                out = rounded(x) if y.dtype == storage and y.dtype.names == storage.names else None
                return cast_like(x, y, 1 if saturate is None else saturate) if out is None else (out,)

        classes.append(CastLike)
    ops = "/".join(cls.__name__ for cls in classes)
    return classes, [f"{ops} to bfloat16 round to nearest even, as ONNX Runtime, OpenVINO and onnx>=1.19's "
                     "reference do (this onnx truncates)"]
