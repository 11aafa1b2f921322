"""The ``onnxruntime`` section of ``repro.py``: an ONNX Runtime session with the spec's settings."""

from __future__ import annotations

from graphbisect.artifacts.repro_backends._common import _ORT_RUN_TARGET, ReproBackend, _ort_options

_ORT_CODE = r'''
# ------------------------------------------------------------------------------ the target: ONNX Runtime
def import_library(options):
    """Import onnxruntime and check that the requested execution providers exist; returns its version."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise CannotRun(f"onnxruntime is not installed ({exc}); pip install onnxruntime") from exc
    missing = [p for p in options["providers"] if p not in onnxruntime.get_available_providers()]
    if missing:
        raise CannotRun(f"execution provider(s) {missing} are not available in onnxruntime "
                        f"{onnxruntime.__version__} (available: {onnxruntime.get_available_providers()})")
    if not hasattr(onnxruntime.GraphOptimizationLevel, options["graph_optimization_level"]):
        raise CannotRun(f"onnxruntime {onnxruntime.__version__} has no {options['graph_optimization_level']}")
    return onnxruntime.__version__


def load_target(model_path, options):
    """Create the session exactly as graphbisect did: same providers, optimization level, disabled
    optimizers, intra-op threads and session config entries."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, options["graph_optimization_level"])
    if options["intra_op_num_threads"] is not None:
        so.intra_op_num_threads = options["intra_op_num_threads"]
    for key, value in options["session_config"]:
        so.add_session_config_entry(key, value)
    return ort.InferenceSession(str(model_path), so, providers=options["providers"],
                                disabled_optimizers=options["disabled_optimizers"])


''' + _ORT_RUN_TARGET


BACKEND = ReproBackend("onnxruntime", "onnxruntime", "onnxruntime", _ort_options, _ORT_CODE)
