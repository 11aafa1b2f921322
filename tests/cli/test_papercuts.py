"""Issue 38 item 3: the papercuts a new user met. Each test failed on the code before its fix; real backends
(ONNX Runtime, onnx.reference) and real processes, no mocks."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import graphbisect
from graphbisect.backends.base import BackendSpec
from graphbisect.cli.main import main
from graphbisect.errors import BackendError, InputError
from graphbisect.examples.bundled import example_model_path


def test_an_error_names_the_spec_as_the_user_wrote_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--example", "--target", "ort:opt_level=max"]) == 2
    err = capsys.readouterr().err
    # It said "onnxruntime:opt_level=max,save_optimized=1: ...": an option the user never wrote.
    assert "error: ort:opt_level=max: opt_level='max'" in err, err
    assert "save_optimized" not in err


def test_a_worker_that_cannot_start_names_the_spec_as_the_user_wrote_it(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    written = f"ort:opt_level=all,python={tmp_path / 'none' / 'python'}"
    assert main(["compare", "--example", "--target", written]) == 2
    err = capsys.readouterr().err
    # It said "cannot start a worker for onnxruntime:opt_level=all,python=...,save_optimized=1 with ...".
    assert f"error: cannot start a worker for {written} with " in err, err
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
    # a misspelled backend is refused before a worker is announced (it said "starting a worker for ort2 ...")
    assert main(["backends", "--passes", "ort2"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'ort2'" in err and "starting a worker" not in err, err


def _relu_model(folder: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "relu.onnx")
    return folder / "relu.onnx"


def test_api_errors_speak_arguments_and_cli_errors_speak_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError) as caught:
        graphbisect.compare(str(example_model_path()), atol=-1)
    # The hint was "e.g. --atol 1e-4 --rtol 1e-3": a flag the Python caller has no way to pass.
    assert caught.value.hint is not None and "--" not in caught.value.hint and "atol=1e-4" in caught.value.hint
    assert main(["compare", "--example", "--tol", "y:-1"]) == 2
    assert "--tol y:1e-2:1e-3" in capsys.readouterr().err


def test_precision_on_a_model_that_fails_in_fp32_speaks_arguments_to_python(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README's `gb.precision("model.onnx", mode="int8")` on a model the target gets wrong in FP32 already."""
    with pytest.raises(BackendError) as caught:
        graphbisect.precision(str(example_model_path()), mode="int8")
    # The hint was "... or loosen --atol/--rtol".
    hint = caught.value.hint
    assert hint is not None and "--" not in hint and "atol=/rtol=" in hint and "graphbisect.compare()" in hint
    assert main(["precision", str(example_model_path()), "--mode", "int8"]) == 2
    assert "`graphbisect compare` / `graphbisect reduce` first, or loosen --atol/--rtol" in capsys.readouterr().err


@pytest.mark.openvino
def test_tactics_never_suggests_the_perturbation_just_tried(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    model = _relu_model(tmp_path)
    argv = ["tactics", "isolate", str(model), "--builds", "2", "--perturb", "ref_any", "--oracle", "reference",
            "--atol", "1", "--rtol", "1", "--workdir", str(tmp_path / "w")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "all 2 builds were good" in err
    # It said "perturb the kernels (--perturb ref_any)" to a user who had just passed --perturb ref_any.
    assert "--perturb ref_any" not in err and "other implementations than ref_any" in err, err
    assert "--builds 4" in err
    with pytest.raises(BackendError) as caught:
        graphbisect.tactics.isolate(str(model), builds=2, perturb=["ref_any"], oracle="reference", atol=1, rtol=1)
    assert caught.value.hint is not None and "--" not in caught.value.hint and "builds=4" in caught.value.hint


@pytest.mark.openvino
def test_tactics_has_an_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    assert main(["tactics", "record", "--example", "-o", str(tmp_path / "rec.json")]) == 0
    assert "kernel choices of openvino" in capsys.readouterr().out
    assert (tmp_path / "rec.json").is_file()


def test_iree_refusing_an_old_softmax_says_which_opset_runs_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("iree.compiler")
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]), tmp_path / "sm12.onnx")
    assert main(["compare", str(tmp_path / "sm12.onnx"), "--target", "iree", "--no-layerwise"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: target-unsupported" in out
    # It said only that IREE cannot legalize onnx.Softmax: nothing told that an opset upgrade runs it.
    assert "try iree:opset=13" in out, out
    assert main(["compare", str(tmp_path / "sm12.onnx"), "--target", "iree:opset=13", "--no-layerwise"]) == 0


def test_backends_says_what_it_does_before_the_long_imports(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "graphbisect", "backends"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    first = child.stderr.readline()
    seconds = time.monotonic() - started
    out, _ = child.communicate(timeout=300)
    # Nothing was printed for the ~25 s the imports took.
    assert first.startswith("importing every backend's library"), first
    assert seconds < 15, seconds
    assert "onnxruntime" in out
    from graphbisect.backends import resolve

    if resolve("iree", require_available=False)[1].availability().available:  # each row: name, yes, its version
        import importlib.metadata

        line = next(line for line in out.splitlines() if line.startswith("iree "))
        assert line.split()[1:3] == ["yes", importlib.metadata.version("iree-base-compiler")]


def test_the_compiled_as_column_keeps_the_count_when_the_kind_is_cut() -> None:
    from graphbisect.artifacts.compare_text import compiled_as_cell
    from graphbisect.localize.compiled import CompiledNode

    node = CompiledNode("n", "SkipSimplifiedLayerNormalization", tuple(f"a{i}" for i in range(12)), ("y",))
    # The table cut the cell at 30 characters: "SkipSimplifiedLayerNormalizati", the count ×12 gone.
    cell = compiled_as_cell(node, width=30)
    assert cell == "SkipSimplifiedLayerNormal… ×12" and len(cell) <= 30, cell
    inferred = CompiledNode("n", "SkipSimplifiedLayerNormalization", ("a", "b", "c"), ("y",), inferred=("c",))
    assert compiled_as_cell(inferred, width=30) == "SkipSimplifie… ×3 (1 inferred)"
    assert compiled_as_cell(CompiledNode("n", "Relu", ("r",), ("y",)), width=30) == "Relu"
    assert compiled_as_cell(node) == "SkipSimplifiedLayerNormalization ×12"  # the HTML page's cell, whole


def test_the_journey_chart_of_the_main_job_shows_every_run_of_the_search(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out = tmp_path / "bug"
    assert main(["reduce", "--example", "-o", str(out)]) == 1
    printed = capsys.readouterr()
    # "note: 3 candidate(s) failed with the baseline's kind but another identity": counts agree with their nouns
    assert "(s)" not in printed.out + printed.err and not re.search(r"\b1 [a-z]+s\b", printed.out), printed.out
    report = json.loads((out / "report.json").read_text())
    svg = (out / "journey.svg").read_text()
    tests = report["search"]["tests"]
    assert tests > 2 and report["search"].get("cache_hits", 0) == 0
    # It drew the two accepted steps, 200 → 9 at run 1, and said "1 search runs of the target": the 9 runs that
    # proved the 9 nodes 1-minimal were not on it.
    assert f">{tests} search runs of the target<" in svg, svg
    assert len(report["trail"]) == tests and [run for run, _, _ in report["trail"]] == list(range(1, tests + 1))
    assert svg.count("<circle") == tests and svg.count('fill="#d62728"') == sum(f for _, _, f in report["trail"])
    assert re.search(r">\d+ candidates run: \d+ failed the same way \(filled; 1 step smaller than the best so far\)",
                     svg), svg
    assert "a model of 9 nodes reduced by graphbisect" in (out / "report.md").read_text()


def test_a_count_agrees_with_its_noun(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphbisect.text.printable import plural

    assert [plural(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert (plural(2, "pass"), plural(2, "entry"), plural(2, "key")) == ("2 passes", "2 entries", "2 keys")
    model = _relu_model(tmp_path)
    assert main(["compare", str(model), "--oracle", "reference", "--target", "ort", "--no-layerwise"]) == 0
    out = capsys.readouterr().out
    # The header said "(1 nodes, 3f2a...)".
    assert "relu.onnx  (1 node, " in out, out


def test_the_pass_search_counts_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["passes", "--example"]) == 1
    err = capsys.readouterr().err
    # It said "disabling all 1 fired passes" and "[passes] ... best 2/2 nodes | ... | disable-set".
    assert "… disabling the fired pass (the failure must disappear)" in err, err
    assert "… listing the passes that fire with it disabled" in err, err
    assert re.search(r"^\[passes\] .* best 2/2 passes \| candidates .* \| disable-set", err, re.M), err
    assert " nodes |" not in err


def test_a_script_without_a_main_guard_is_told_so_by_the_workers_it_starts(tmp_path: Path) -> None:
    """The README's API lines pasted into a script: triage's worker processes import the script again."""
    import subprocess
    import sys

    (tmp_path / "models").mkdir()
    _relu_model(tmp_path / "models")
    script = tmp_path / "triage_them.py"
    script.write_text("import graphbisect as gb\n"
                      "print('bugs', gb.triage('models', 'out', oracle='reference', jobs=2).bugs)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    # Each worker re-ran the script, whose triage found the folder locked by the first: "out is in use by another
    # process (pid N) ... hint: wait for it to finish, or choose another -o folder", and the workers died.
    assert "is in use by another process" not in done.stderr, done.stderr
    assert "graphbisect.triage was called while a worker process graphbisect started was importing " \
           f"{script}" in done.stderr, done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    script.write_text("import graphbisect as gb\nif __name__ == '__main__':\n"
                      "    print('bugs', gb.triage('models', 'out', oracle='reference', jobs=2).bugs)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and "bugs ()" in done.stdout and "Traceback" not in done.stderr, done.stderr


def test_triage_says_at_once_what_it_is_doing(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys
    import time

    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(example_model_path(), folder / "ex.onnx")
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "graphbisect", "triage", str(folder), "-o", str(tmp_path / "out")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    first = child.stderr.readline()
    seconds = time.monotonic() - started
    out, _ = child.communicate(timeout=600)
    # Nothing was printed for the first ~20 s of a ~35 s run (the first line was the model's outcome).
    assert first.startswith(f"… triaging 1 model of {folder} on local: "), first
    assert seconds < 15, seconds
    assert child.returncode == 1
    assert "1 model (0 finished earlier)" in out and "1 distinct bug in 1 failing model, 0 passed, 0 errors" in out, out


def test_a_spec_with_every_other_pass_disabled_is_printed_as_a_count(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from graphbisect.backends.base import brief_spec

    assert brief_spec("ort:disabled=A;B;C;D;E,opt_level=all", where="report.json") == \
        "ort:disabled=<5 passes>,opt_level=all (the full spec: report.json)"
    assert brief_spec("ort:disabled=A;B,opt_level=all", where="report.json") == "ort:disabled=A;B,opt_level=all"
    out = tmp_path / "bug"
    assert main(["reduce", "--example", "--passes", "-o", str(out)]) == 1
    printed = capsys.readouterr()
    floor = json.loads((out / "report.json").read_text())["passes"]["culprit_floor"]["spec"]
    disabled = BackendSpec.parse(floor).option_list("disabled")
    assert len(disabled) > 50
    # The floor's spec, every disabled optimizer listed, made two ~1,900-character lines.
    lines = [line for line in (printed.out + printed.err).splitlines() if "opt_level=" in line]  # a spec's
    assert lines and max(map(len, lines)) < 200, max(lines, key=len)
    assert f"noise floor (onnxruntime:disabled=<{len(disabled)} passes>,opt_level=disable; the full spec: " \
           "report.json)" in printed.out, printed.out
    assert f"measuring the target's noise floor: onnxruntime:disabled=<{len(disabled)} passes>" in printed.err


def test_the_cli_prints_the_hint_in_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """An error raised with a hint for each road (errors.py): the CLI shows the flags, not the API's arguments."""
    assert main(["tactics", "isolate", "--example"]) == 2
    err = capsys.readouterr().err
    assert "hint: pass --oracle SPEC" in err and "oracle=" not in err
