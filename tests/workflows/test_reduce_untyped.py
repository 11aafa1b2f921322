"""`reduce` through tensors onnx's shape inference leaves untyped, and what 1-minimal may claim (issue 35).

onnx.reference as the target of a Scaler → SVMClassifier → Cast model (ONNX Runtime the oracle): the two
disagree on the SVMClassifier's probabilities, and the SVMClassifier alone, fed the Scaler's captured values,
fails the same way. Before, every candidate cut at the Scaler's untyped output or exposing the classifier's
unshaped labels was refused by ``onnx.checker`` without a run ("invalid model: Field 'shape' of 'type' is
required but missing"), the engine took each such removal for "the failure disappears", and reduce reported
"3 → 3 nodes, 1-minimal"; on a chain through a string tensor "7 → 6, 1-minimal". Now those candidates are
valid (declared from the captured values) and run; and a removal whose candidate cannot be built is not
tested, so 1-minimality is then not claimed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from graphbisect.model import load_model
from graphbisect.strategies.subgraph import Candidate, SubgraphSpace
from graphbisect.workflows.reduce import ReduceOptions, ReduceResult, reduce_model, work_dir_for
from tests.strategies.untyped_models import inputs, scaler_svm, string_chain


def _reduce(model: onnx.ModelProto, out: Path) -> ReduceResult:
    return reduce_model(load_model(model), out, inputs=inputs(),
                        options=ReduceOptions(target="reference", keep_work=True))


def _journal(out: Path) -> list[dict[str, object]]:
    lines = (work_dir_for(out) / "journal.jsonl").read_text().splitlines()[1:]
    return [entry for entry in map(json.loads, lines) if "outcome" in entry]


@pytest.mark.parametrize(("build", "nodes"), [(scaler_svm, 3), (string_chain, 7)], ids=["scaler-svm", "string-chain"])
def test_a_classifier_behind_untyped_tensors_reduces_to_the_classifier(
        build: Callable[[], onnx.ModelProto], nodes: int, tmp_path: Path) -> None:
    result = _reduce(build(), tmp_path / "bug")
    assert result.failed and result.signature.kind.value == "mismatch"
    assert (result.original_nodes, result.kept_nodes) == (nodes, ("svm",)), result.notes
    assert result.one_minimal and result.verified and result.stop_reason is None
    invalid = [entry for entry in _journal(tmp_path / "bug") if "invalid model" in str(entry.get("detail"))]
    assert not invalid, invalid  # every candidate was a model the checker passes, and ran


def test_a_removal_whose_candidate_cannot_be_built_is_not_tested(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate fed the Scaler's output refused as the checker refused it before: removing the Scaler from
    the result was never run, so the result (Scaler + SVMClassifier) is not called 1-minimal, and a note says
    which removal and why."""
    message = "Field 'shape' of 'type' is required but missing."
    check = SubgraphSpace.check

    def refuse_cut_at_s(self: SubgraphSpace, candidate: Candidate, path: Path) -> str | None:
        if "s" in {value.name for value in candidate.proto.graph.input}:
            return message
        return check(self, candidate, path)

    monkeypatch.setattr(SubgraphSpace, "check", refuse_cut_at_s)
    result = _reduce(scaler_svm(), tmp_path / "bug")
    assert result.kept_nodes == ("scaler", "svm") and result.verified and result.stop_reason is None
    assert not result.one_minimal
    note = next(note for note in result.notes if note.startswith("1-minimality is not established"))
    assert "the removal of 1 of the 2 nodes (scaler) was not tested" in note and message in note, note
    assert json.loads((tmp_path / "bug" / "report.json").read_text())["one_minimal"] is False
    removal = next(entry for entry in _journal(tmp_path / "bug") if entry["key"] == "1")  # svm alone
    assert removal["outcome"] == "unresolved" and removal["invoked"] is False
