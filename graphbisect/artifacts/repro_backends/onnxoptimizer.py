"""The ``onnxoptimizer`` section of ``repro.py``: onnxoptimizer's passes, the result run in ONNX Runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import _ORT_INERT, _ORT_RUN_TARGET, ReproBackend, _ort_options
from graphbisect.backends.inert import ANY, nested
from graphbisect.backends.onnxoptimizer import OptimizerOptions


def _onnxoptimizer_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The passes graphbisect's onnxoptimizer backend applies, and the ORT session it runs the result in.

    ``passes`` is None for the installed onnxoptimizer's default list, resolved where the script runs (as the
    runtime resolves it in its worker).
    """
    parsed = OptimizerOptions.parse(options)
    return {"passes": list(parsed.passes) or None, "disabled": list(parsed.disabled),
            "onnxruntime": _ort_options(parsed.ort_options())}


_ONNXOPTIMIZER_CODE = r'''
# ------------------------------------------- the target: onnxoptimizer's passes, then ONNX Runtime without its own
def import_library(options):
    """Import onnx, onnxoptimizer and onnxruntime; check the pass names; returns onnxoptimizer's version."""
    try:
        import onnx  # the passes need it too
        import onnxoptimizer
        import onnxruntime
    except ImportError as exc:
        raise CannotRun(f"{exc}; pip install onnx onnxoptimizer onnxruntime") from exc
    available = set(onnxoptimizer.get_available_passes())
    unknown = [name for name in (options["passes"] or []) + options["disabled"] if name not in available]
    if unknown:
        raise CannotRun(f"onnxoptimizer {onnxoptimizer.__version__} has no pass(es) {unknown}")
    check_ort(onnxruntime, options["onnxruntime"])
    return onnxoptimizer.__version__


def load_target(model_path, options):
    """Apply the passes as graphbisect did (one at a time, in order; the default list when none are named,
    minus the disabled ones), then create an ONNX Runtime session on the result with its optimizations off."""
    import onnx
    import onnxoptimizer

    model = onnx.load(str(model_path))
    passes = options["passes"] or list(onnxoptimizer.get_fuse_and_elimination_passes())
    for name in (p for p in passes if p not in set(options["disabled"])):
        model = onnxoptimizer.optimize(model, [name])
    return ort_session(model.SerializeToString(), options["onnxruntime"])


''' + _ORT_RUN_TARGET


BACKEND = ReproBackend("onnxoptimizer", "onnx, onnxoptimizer and onnxruntime", "onnxoptimizer",
                       _onnxoptimizer_options, _ONNXOPTIMIZER_CODE,
                       {"passes": ANY, "disabled": ANY, "onnxruntime": nested(_ORT_INERT)})
