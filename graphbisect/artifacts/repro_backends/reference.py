"""The ``reference`` section of ``repro.py``: the ONNX reference evaluator (``onnx.reference``), as graphbisect
runs it.

graphbisect's ``reference`` backend rounds Cast/CastLike to bfloat16 to nearest even where the installed onnx
truncates (:mod:`graphbisect.backends.reference`). A plain ``ReferenceEvaluator`` would compute those casts
otherwise, so a bundle's script could contradict the failure it reproduces; the section embeds the text of
:mod:`graphbisect.backends.reference_casts` (standalone: numpy and onnx only) and builds the evaluator with the
same overrides, probed on the reader's onnx, and prints that it did.
"""

from __future__ import annotations

from graphbisect.artifacts.repro_backends._common import ReproBackend, _no_options, embedded_source
from graphbisect.backends import reference_casts

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
    """The ONNX reference evaluator, patched where graphbisect patches it (rounding_casts below: Cast/CastLike
    to bfloat16 round to nearest even where this onnx truncates), so it computes what graphbisect ran."""
    from onnx.reference import ReferenceEvaluator

    overrides, patched = rounding_casts()
    for line in patched:
        print(f"onnx.reference patched as graphbisect runs it: {line}", flush=True)
    return ReferenceEvaluator(str(model_path), new_ops=overrides or None)


def run_target(evaluator, inputs, output_names):
    """Run once, feeding the evaluator's inputs."""
    accepted = set(evaluator.input_names)
    values = evaluator.run(output_names, {name: value for name, value in inputs.items() if name in accepted})
    return dict(zip(output_names, (as_value(v) for v in values)))


# graphbisect/backends/reference_casts.py, verbatim: the overrides graphbisect's reference backend uses
''' + embedded_source(reference_casts) + "\n"


BACKEND = ReproBackend("reference", "onnx (onnx.reference)", "onnx", _no_options, _REFERENCE_CODE)
