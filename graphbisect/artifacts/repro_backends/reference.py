"""The ``reference`` section of ``repro.py``: the ONNX reference evaluator (``onnx.reference``)."""

from __future__ import annotations

from graphbisect.artifacts.repro_backends._common import ReproBackend, _no_options

_REFERENCE_CODE = r'''
# ------------------------------------------------------------------- the target: onnx.reference (numpy)
def import_library(options):
    """Import onnx (its reference evaluator); returns its version."""
    try:
        import onnx
    except ImportError as exc:
        raise CannotRun(f"onnx is not installed ({exc}); pip install onnx") from exc
    return onnx.__version__


def load_target(model_path, options):
    """The ONNX reference evaluator: the specification written in numpy."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(model_path))


def run_target(evaluator, inputs, output_names):
    """Run once, feeding the evaluator's inputs."""
    accepted = set(evaluator.input_names)
    values = evaluator.run(output_names, {name: value for name, value in inputs.items() if name in accepted})
    return dict(zip(output_names, (as_value(v) for v in values)))

'''


BACKEND = ReproBackend("reference", "onnx (onnx.reference)", "onnx", _no_options, _REFERENCE_CODE)
