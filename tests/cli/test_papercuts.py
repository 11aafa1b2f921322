"""Issue 38 item 3: the papercuts a new user met. Each test failed on the code before its fix; real backends
(ONNX Runtime, onnx.reference) and real processes, no mocks."""

from __future__ import annotations

import pytest

from graphbisect.backends.base import BackendSpec
from graphbisect.cli.main import main


def test_an_error_names_the_spec_as_the_user_wrote_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--example", "--target", "ort:opt_level=max"]) == 2
    err = capsys.readouterr().err
    # It said "onnxruntime:opt_level=max,save_optimized=1: ...": an option the user never wrote.
    assert "error: ort:opt_level=max: opt_level='max'" in err, err
    assert "save_optimized" not in err


def test_a_spec_keeps_its_written_text_only_while_it_says_what_runs() -> None:
    written = BackendSpec.parse(" ort:opt_level=all ")
    assert written.with_options(save_optimized="1").as_written() == "ort:opt_level=all"
    # A change to what the user wrote: the text would no longer say what runs, so the canonical form is shown.
    assert written.with_options(opt_level="disable").as_written() == "ort:opt_level=disable"
    assert written.with_options(opt_level="disable") == BackendSpec("ort", {"opt_level": "disable"})


def test_a_misspelled_pass_gets_the_closest_names_not_all_seventy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--example", "--target", "ort:disabled=LayerNormFuson"]) == 2
    err = capsys.readouterr().err
    assert "did you mean LayerNormFusionL2 or LayerNormFusionL1" in err, err
    # The hint went on with "Valid names here: AttentionFusion, BiasDropoutFusion, ..." (~70 names, one line).
    assert "AttentionFusion" not in err
    assert max(len(line) for line in err.splitlines()) < 240, err
    assert "`graphbisect backends --passes onnxruntime` lists all" in err
    assert main(["backends", "--passes", "ort"]) == 0
    listed = capsys.readouterr().out.split()
    assert "LayerNormFusionL1" in listed and "AttentionFusion" in listed and len(listed) > 50
