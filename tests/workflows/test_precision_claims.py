"""`graphbisect precision` states only what the trusted checker re-established (issue 35).

The model: the residual CNN whose third block overflows float16 (:func:`~graphbisect.examples.precision_models.
residual_cnn`), on ONNX Runtime. The checker runs the files ``-o`` wrote (``mixed_precision.onnx``,
``mixed_precision_typed.onnx``) and the answer with each kept node lowered too, plainly, against one plain oracle
run of the FP32 model; a claim it does not find is printed and written as not holding.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.cli.main import main
from graphbisect.cli.precision_cmd import print_result
from graphbisect.compare import Tolerance
from graphbisect.examples.precision_models import cnn_inputs, residual_cnn
from graphbisect.model import load_model
from graphbisect.precision.lowering import Lowering
from graphbisect.precision.modes import PrecisionMode
from graphbisect.workflows.precision import PrecisionResult, check_precision, find_precision
from graphbisect.workflows.precision_claims import Answer

TOL = Tolerance(atol=0.05, rtol=0.05)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[PrecisionResult, Path, dict[str, Any]]:
    """fp16 on the residual CNN, written to ``out``: (result, the output folder, the inputs)."""
    out = tmp_path_factory.mktemp("cnn") / "out"
    feeds = cnn_inputs()
    result = find_precision(load_model(residual_cnn()), mode=PrecisionMode.FP16, inputs=feeds, tolerance=TOL,
                            out_dir=out)
    return result, out, feeds


def _answer(keep_names: tuple[str, ...], folder: Path, out_dir: Path | None = None) -> tuple[Lowering, Answer]:
    model = load_model(residual_cnn())
    lowering = Lowering(model, PrecisionMode.FP16)
    unit = {name: u for u, name in enumerate(lowering.names(range(len(lowering.units))))}
    keep = frozenset(unit[name] for name in keep_names)
    folder.mkdir(parents=True, exist_ok=True)
    return lowering, Answer(lowering, keep, DEFAULT_TARGET, fp32_model=model.save(folder / "fp32.onnx"),
                            scratch=folder, out_dir=out_dir)


def test_every_claim_of_a_real_answer_holds_and_is_what_is_printed(
        cnn: tuple[PrecisionResult, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    result, _, _ = cnn
    assert result.keep_fp32 and result.minimal and result.meets_tolerance
    audit = result.audit
    assert audit is not None and audit["holds"] is True
    assert [c["id"] for c in audit["claims"]] == ["verified", "typed", "one_minimal", "breaks_alone", "prefix"]
    assert all(c["holds"] is True for c in audit["claims"])
    # one oracle run; the answer, the typed model, the answer with each kept node lowered, each kept node lowered
    # alone, the prefix answer and one node less
    runs = 2 + 2 * len(result.keep_fp32) + 2
    assert audit["runs"] == {"oracle": 1, "target": runs}
    assert result.invocations["audit target"] == runs
    assert json.loads(json.dumps(result.to_json()))["audit"]["claims"] == audit["claims"]
    print_result(result, rows=0)
    printed = capsys.readouterr().out
    assert f"checked (oracle 1, target {runs} plain runs of the files written" in printed
    for claim in audit["claims"]:
        assert f"  holds: {claim['claim']}" in printed
    assert f"keep in FP32 ({len(result.keep_fp32)}, 1-minimal):" in printed
    assert "\nverified: the model with these overrides meets the tolerance" in printed
    assert "the checker" not in printed.replace("a checker that shares no code", "")


def test_the_checker_runs_the_file_written_not_the_searchs_model(
        cnn: tuple[PrecisionResult, Path, dict[str, Any]], tmp_path: Path) -> None:
    """``mixed_precision.onnx`` replaced by the fully lowered model (which overflows): the claim on the written
    file does not hold, whatever the search measured."""
    result, out, feeds = cnn
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    lowering, answer = _answer(result.keep_fp32, tmp_path / "scratch", out_dir=copy)
    onnx.save(lowering.lower(frozenset()), copy / "mixed_precision.onnx")
    checked = check_precision(dataclasses.replace(result, audit=None), answer, oracle=DEFAULT_ORACLE, inputs=feeds,
                              tolerance=TOL)
    verified = checked.claim("verified")
    assert verified is not None and verified["holds"] is False and "nan" in verified["evidence"]
    assert not checked.meets_tolerance


def test_false_claims_are_caught_and_neither_printed_nor_written_as_fact(
        cnn: tuple[PrecisionResult, Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong answer given to the checker: one needed node left out of the FP32 set (claimed to meet the
    tolerance), and one unneeded node added (claimed 1-minimal)."""
    result, _, feeds = cnn
    lowering = Lowering(load_model(residual_cnn()), PrecisionMode.FP16)
    everything = lowering.names(range(len(lowering.units)))
    short = result.keep_fp32[1:]
    _, answer = _answer(short, tmp_path / "short")
    wrong = dataclasses.replace(result, keep_fp32=short, audit=None, extra={**result.extra, "typed_model": None})
    checked = check_precision(wrong, answer, oracle=DEFAULT_ORACLE, inputs=feeds, tolerance=TOL)
    verified = checked.claim("verified")
    assert verified is not None and verified["holds"] is False and "nan" in verified["evidence"]
    assert checked.meets_tolerance is False and checked.to_json()["meets_tolerance"] is False
    one = checked.claim("one_minimal")
    assert one is not None and one["holds"] is True  # lowering any other kept node overflows as well

    spare = next(name for name in everything if name not in result.keep_fp32 and name.startswith("block1"))
    padded = (*result.keep_fp32, spare)
    _, answer = _answer(padded, tmp_path / "padded")
    checked_padded = check_precision(dataclasses.replace(result, keep_fp32=padded, audit=None), answer,
                                     oracle=DEFAULT_ORACLE, inputs=feeds, tolerance=TOL)
    one = checked_padded.claim("one_minimal")
    assert one is not None and one["holds"] is False and f"{spare} lowered: within tolerance" in one["evidence"]
    assert checked_padded.minimal is False and checked_padded.to_json()["minimal"] is False

    print_result(checked, rows=0)
    print_result(checked_padded, rows=0)
    printed = capsys.readouterr().out
    assert "\nNOT verified: the model with these overrides meets the tolerance on onnxruntime:opt_level=all: " \
           "does NOT hold (the checker)" in printed
    assert f"keep in FP32 ({len(padded)}, 1-minimal does NOT hold (the checker)):" in printed
    assert "  DOES NOT HOLD: 1-minimal" in printed


def test_the_cli_exit_code_and_json_are_the_checkers(tmp_path: Path) -> None:
    """`graphbisect precision --json`: the audit section, and exit 0 only for a confirmed answer."""
    model, inputs = tmp_path / "cnn.onnx", tmp_path / "x.npz"
    onnx.save(residual_cnn(), model)
    np.savez(inputs, **cnn_inputs())
    code = main(["precision", str(model), "--inputs", str(inputs), "--atol", "0.05", "--rtol", "0.05", "--no-prefix",
                 "--json", str(tmp_path / "r.json")])
    data = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and data["meets_tolerance"] is True and data["audit"]["holds"] is True
    assert data["invocations"]["audit oracle"] == 1


def test_breaks_alone_and_the_prefix_answer_are_the_checkers(
        cnn: tuple[PrecisionResult, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """The honest answer: each kept node of block3 breaks the tolerance alone, and the prefix answer meets it
    where one node less does not, each confirmed by a plain run (3 + 2 target runs)."""
    result, _, _ = cnn
    assert result.breaks_alone == result.keep_fp32 and result.prefix_keep_fp32
    for claim_id in ("breaks_alone", "prefix"):
        claim = result.claim(claim_id)
        assert claim is not None and claim["holds"] is True, claim
    assert result.claim("only_together") is None  # every kept node breaks alone: no other to check
    assert "alone_search" not in result.extra and "prefix_search" not in result.extra
    assert result.to_json()["prefix_keep_fp32"] == len(result.prefix_keep_fp32)
    print_result(result, rows=0)
    printed = capsys.readouterr().out
    assert f"Polygraphy-style prefix answer: the first {len(result.prefix_keep_fp32)} nodes in FP32\n" in printed
    assert "  holds: each of the 3 nodes found to break the tolerance alone" in printed


def test_a_wrong_breaks_alone_and_prefix_answer_of_the_search_are_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The search's answer made wrong (its result objects, not the backend): it says only the first kept node and
    a block1 node break the tolerance alone, and that the first 5 nodes in FP32 meet it. The checker's plain runs
    find otherwise; what is printed and written is what they found, the search's word marked as not holding."""
    from graphbisect.engine.types import SearchResult, SearchStats
    from graphbisect.workflows import precision

    lowering = Lowering(load_model(residual_cnn()), PrecisionMode.FP16)
    names = lowering.names(range(len(lowering.units)))
    spare = next(u for u, name in enumerate(names) if name.startswith("block1"))

    def wrong_breakers(ev: Any, keep: frozenset[int]) -> list[int]:
        return [min(keep), spare]

    def wrong_prefix(ev: Any) -> SearchResult:
        return SearchResult(frozenset(range(5)), minimal=True, stop_reason=None, stats=SearchStats(),
                            history=(), found=5)

    monkeypatch.setattr(precision, "alone_breakers", wrong_breakers)
    monkeypatch.setattr(precision, "prefix_answer", wrong_prefix)
    result = find_precision(load_model(residual_cnn()), mode=PrecisionMode.FP16, inputs=cnn_inputs(), tolerance=TOL,
                            workdir=tmp_path / "work")
    breaks, together, prefix = (result.claim(i) for i in ("breaks_alone", "only_together", "prefix"))
    assert breaks is not None and breaks["holds"] is False and f"{names[spare]} lowered alone: within" in \
        breaks["evidence"]
    assert together is not None and together["holds"] is False  # the other kept nodes do break alone
    assert prefix is not None and prefix["holds"] is False
    assert result.breaks_alone == result.keep_fp32  # what the checker's runs showed, not the search's list
    assert result.prefix_keep_fp32 is None and result.to_json()["prefix_keep_fp32"] is None
    data = json.loads(json.dumps(result.to_json()))
    assert set(data["alone_search"]["breaks_alone"]) == {result.keep_fp32[0], names[spare]}
    assert data["alone_search"]["holds"] is False
    assert data["prefix_search"]["prefix_keep_fp32"] == 5 and data["prefix_search"]["holds"] is False
    print_result(result, rows=0)
    printed = capsys.readouterr().out
    assert "Polygraphy-style prefix answer (the search's): the first 5 nodes in FP32 — does NOT hold (the checker)" \
        in printed
    assert "NOT hold (the checker); marked above: the checker's runs" in printed
    assert f"the search found these to break the tolerance alone: {names[spare]}, {result.keep_fp32[0]} — does " \
        "NOT hold (the checker)" in printed
    assert "  DOES NOT HOLD: Polygraphy-style prefix answer" in printed

