"""The ``onnxruntime`` section of ``repro.py``: an ONNX Runtime session with the spec's settings."""

from __future__ import annotations

from graphbisect.artifacts.repro_backends._common import _ORT_INERT, _ORT_RUN_TARGET, ReproBackend, _ort_options

_ORT_CODE = r'''
# ------------------------------------------------------------------------------ the target: ONNX Runtime
def import_library(options):
    """Import onnxruntime and check that the requested execution providers exist; returns its version."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise CannotRun(f"onnxruntime is not installed ({exc}); pip install onnxruntime") from exc
    check_ort(onnxruntime, options)
    return onnxruntime.__version__


def load_target(model_path, options):
    """Create the session exactly as graphbisect did (``ort_session``)."""
    return ort_session(str(model_path), options)


def compiled_nodes(target, model_path, options):
    """What ONNX Runtime compiled the model into, as {"kind", "name"} per node: its optimized model, saved by a
    second session with the same settings (None when the onnx package, which reads it, is missing)."""
    try:
        import onnx
    except ImportError:
        return None
    with tempfile.TemporaryDirectory(prefix="repro-optimized-") as tmp:
        ort_session(str(model_path), options, optimized=str(Path(tmp) / "optimized.onnx"))
        graph = onnx.load(str(Path(tmp) / "optimized.onnx"), load_external_data=False).graph
        return [{"kind": node.op_type, "name": node.name} for node in graph.node]


''' + _ORT_RUN_TARGET


BACKEND = ReproBackend("onnxruntime", "onnxruntime", "onnxruntime", _ort_options, _ORT_CODE, _ORT_INERT)
