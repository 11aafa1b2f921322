"""One classifier for refusals across backends (issue 26 item 7): what OpenVINO and IREE refuse for lack of an op or
a type is ``unsupported`` whatever their wording, and a title shows the op and the reason, not a source location.

Before: OpenVINO's "No conversion rule found for operations: ai.onnx.ml.TreeEnsembleRegressor" and its Loop
conversion failure were ``target-crash``, its "Unsupported value_info type" ``target-unsupported``, IREE's
"Unsupport list element type" ``target-crash``; the file-name rule turned ``ai.onnx.ml`` into ``model.onnx.ml``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import BackendProcess, RunStatus
from graphbisect.oracle.outcome import classify_failed_run, headline, refusal_of
from graphbisect.oracle.signature import FailureKind, Signature, signature_of
from tests.refusal_models import REFUSED

CASES = [  # backend, model, what the refusal names, the title
    ("openvino", "tree_ensemble", "ai.onnx.ml.TreeEnsembleRegressor",
     "no conversion rule found for ai.onnx.ml.TreeEnsembleRegressor"),
    ("openvino", "scaler", "ai.onnx.ml.Scaler", "no conversion rule found for ai.onnx.ml.Scaler"),
    ("openvino", "zipmap", "value_info type", "unsupported value_info type: output_probability"),
    ("openvino", "passthrough_loop", "Loop",
     "cannot convert Loop: The provided loop body graph canonical inputs size (5), does not match the sum of loop "
     "carried dependencies and two mandatory inputs (4)"),
    ("iree", "zipmap", "list element type", "unsupported list element type"),
    ("iree", "scaler", "Scaler", "IREE's ONNX importer has no conversion for onnx.Scaler"),
]


@pytest.mark.parametrize(("backend", "name", "what", "title"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_real_refusal_is_unsupported_and_titled_by_its_op(tmp_path: Path, backend: str, name: str, what: str,
                                                            title: str) -> None:
    pytest.importorskip({"openvino": "openvino", "iree": "iree.compiler"}[backend])
    path = tmp_path / f"{name}.onnx"
    onnx.save(REFUSED[name](), str(path))
    with BackendProcess(backend, workdir=tmp_path / "worker") as worker:
        run = worker.run(path, {"x": np.ones((2, 3), np.float32)})
    assert run.status is RunStatus.CRASH, run.describe()
    signature = signature_of(run, None)
    assert signature.kind is FailureKind.UNSUPPORTED, signature.describe()
    assert classify_failed_run(run, "target").cls.value == "target-unsupported"
    refusal = refusal_of(run.error_type, run.message)
    assert refusal is not None and refusal.what == what
    # the title, from the backend's message and from the recorded signature alike
    assert headline(run.error_type, run.message) == title
    assert headline(None, signature.detail) == title
    assert "model.onnx.ml" not in signature.detail
    assert not title.startswith("Exception from")


def test_a_signature_recorded_before_reads_as_today() -> None:
    """A bundle recorded with the old rules: an OpenVINO conversion failure was a crash and ``ai.onnx.ml`` read
    ``model.onnx.ml``; it is re-read as the refusal it is, with the domain, so it still matches."""
    old = {"kind": "crash-load", "detail": "RuntimeError: Exception from core.cpp: Check 'false' failed at "
           "unconverted_ops_report.cpp: FrontEnd API failed with OpConversionFailure: Model wasn't fully converted. "
           "Summary: -- No conversion rule found for operations: model.onnx.ml.Scaler"}
    again = Signature.from_json(old)
    assert again.kind is FailureKind.UNSUPPORTED
    assert again.detail.endswith("operations: ai.onnx.ml.Scaler")
