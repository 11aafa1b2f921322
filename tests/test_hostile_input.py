"""Issue 16: hostile input and clumsy use — nothing leaks, nothing is lost, nothing false is certified.

One test (or a parametrized family) per numbered item of the issue; each failed on the code before the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphbisect.artifacts.bundle import is_bundle
from graphbisect.artifacts.overrides import PrecisionOverrides
from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.data import load_inputs, save_inputs
from graphbisect.errors import InputError, ModelError
from graphbisect.examples import host_network
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.model import load_model
from graphbisect.storage.lockfile import folder_lock
from graphbisect.workflows.reduce import work_dir_for

_ROOT = str(Path(__file__).resolve().parents[1])
EXAMPLE = [str(example_model_path()), "--inputs", str(example_inputs_path())]


# --- item 7: arguments are validated when parsed; an internal error is exit 3, never 1 ------------------
@pytest.mark.parametrize("bad", [
    ["--atol", "nan"], ["--rtol", "inf"], ["--atol", "-1"], ["--min-cosine", "2"], ["--tol", "y:nan"],
    ["--target", "onnxruntime:timeout=inf"], ["--target", "onnxruntime:timeout=nan"],
])
def test_item7_compare_refuses_values_that_would_pass_a_failing_model(bad: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    # The bundled example fails on ONNX Runtime; a NaN or infinite tolerance used to make it PASS (exit 0).
    assert main(["compare", *EXAMPLE, "--no-layerwise", *bad]) == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and bad[0] in err


@pytest.mark.parametrize("bad", [
    ["-j", "0"], ["--max-invocations", "-1"], ["--fail-regex", "("], ["--deadline", "nan"], ["--timeout", "inf"],
    ["-o", "/proc/graphbisect-x"], ["--json", "/proc/graphbisect-x.json"],
])
def test_item7_reduce_refuses_bad_arguments_before_any_run(bad: list[str], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ["reduce", "--example", *bad] + ([] if bad[0] == "-o" else ["-o", str(tmp_path / "b")])
    assert main(args) == 2
    assert "error: argument" in capsys.readouterr().err
    assert not (tmp_path / "b.work").exists()  # nothing ran


def test_item7_unknown_tolerance_name_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compare", *EXAMPLE, "--no-layerwise", "--tol", "nosuch:1"]) == 2
    assert "no tensor 'nosuch'" in capsys.readouterr().err


def test_item7_tolerance_api_refuses_nan_and_inf() -> None:
    for kwargs in ({"atol": float("nan")}, {"rtol": float("inf")}, {"atol": -1.0}, {"min_cosine": 2.0},
                   {"per_output": {"y": (float("nan"), 0.0)}}):
        with pytest.raises(InputError):
            Tolerance(**kwargs)  # type: ignore[arg-type]


def test_item7_internal_error_exits_3_not_1(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from graphbisect.cli import compare_cmd

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(compare_cmd, "run", broken)
    assert main(["compare", *EXAMPLE]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "report" in err


# --- item 1: symbolic links cannot leak local files into a model, its outputs or a bundle ------------------
def _external_add_model(folder: Path, location: str) -> Path:
    """``y = x + w`` with ``w`` (4 floats) stored as external data at ``location``."""
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])], [w])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(np.arange(1, 5, dtype=np.float32).tobytes())  # "private" bytes
    return outside


@pytest.mark.parametrize("how", ["file", "folder"])
def test_item1_symlinked_external_data_outside_the_folder_is_refused(how: str, tmp_path: Path) -> None:
    outside = _secret(tmp_path)
    folder = tmp_path / "model"
    folder.mkdir()
    if how == "file":
        (folder / "leak.bin").symlink_to(outside / "secret.bin")
        location = "leak.bin"
    else:
        (folder / "data").symlink_to(outside, target_is_directory=True)
        location = "data/secret.bin"
    path = _external_add_model(folder, location)
    with pytest.raises(ModelError, match="symbolic link"):
        load_model(path)


def test_item1_symlink_inside_the_folder_still_loads(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "real.bin").write_bytes(np.arange(1, 5, dtype=np.float32).tobytes())
    (folder / "alias.bin").symlink_to("real.bin")
    model = load_model(_external_add_model(folder, "alias.bin"))
    assert [i.name for i in model.proto.graph.initializer] == ["w"]


def test_item1_pb_input_external_data_resolves_beside_the_file_and_not_through_links(tmp_path: Path) -> None:
    outside = _secret(tmp_path)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "x")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "x.bin"
    (inputs / "input_0.pb").write_bytes(tensor.SerializeToString())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(np.zeros(4, np.float32).tobytes())
    target = load_model(_external_add_model(tmp_path / "m", "w.bin"))
    # The data lies beside the .pb file: found there whatever the working folder is.
    (inputs / "x.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    assert load_inputs(inputs / "input_0.pb", target)["x"].tolist() == [7, 7, 7, 7]
    # A link leaving the folder is refused.
    (inputs / "x.bin").unlink()
    (inputs / "x.bin").symlink_to(outside / "secret.bin")
    with pytest.raises(InputError, match="symbolic link"):
        load_inputs(inputs / "input_0.pb", target)


# --- item 9 (smaller ones) ----------------------------------------------------------------------------------
def test_item9_named_pipe_as_model_is_refused_not_read_forever(tmp_path: Path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "graphbisect", "compare", str(fifo)], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": _ROOT})
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


# --- items 2 and 3: -o never loses the user's files, is checked before any run, and is locked ---------------
def _reduce_example(out: Path, *extra: str) -> int:
    return main(["reduce", *EXAMPLE, "-o", str(out), *extra])


@pytest.fixture(scope="module")
def example_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "bug"
    assert _reduce_example(out) == 1
    return out


def _copy(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "downloaded"
    shutil.copytree(bundle, copy)
    return copy


def test_item2_rerun_keeps_the_users_files_in_the_bundle_folder_and_out_of_the_zip(example_bundle: Path,
                                                                                    tmp_path: Path) -> None:
    """A rerun over an earlier bundle of this model, with --zip: the user's files stay in the folder (one
    reduction asserts both, the folder and the zip)."""
    out = _copy(example_bundle, tmp_path)  # an earlier bundle of this model
    (out / "notes.txt").write_text("my notes")
    (out / "logs").mkdir()
    (out / "logs" / "run1.txt").write_text("log")
    (out / "stale_chart.svg").write_text("<svg/>")  # not listed by the bundle: the user's, kept too
    assert _reduce_example(out, "--zip") == 1
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "logs" / "run1.txt").read_text() == "log"
    assert (out / "stale_chart.svg").exists()
    assert is_bundle(out) and (out / "model.onnx").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    with zipfile.ZipFile(out.with_name(out.name + ".zip")) as zf:  # the zip holds the bundle, not the user's files
        members = {Path(n).name for n in zf.namelist()}
    assert not members & {"notes.txt", "run1.txt", "stale_chart.svg"}
    assert {"model.onnx", "report.json", "repro.py"} <= members


def test_item2_bundle_of_another_model_is_refused_before_any_run_unless_forced(
        example_bundle: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = _copy(example_bundle, tmp_path)
    first = (out / "report.json").read_text()
    other = tmp_path / "other.onnx"
    host = host_network(100, bug="layernorm_keepdims0", seed=3)
    onnx.save(host.model, other)
    save_inputs(tmp_path / "other.npz", host.inputs)
    args = ["reduce", str(other), "--inputs", str(tmp_path / "other.npz"), "-o", str(out)]
    assert main(args) == 2
    assert "another model" in capsys.readouterr().err
    assert (out / "report.json").read_text() == first and not work_dir_for(out).exists()
    assert main([*args, "--force"]) == 1
    assert json.loads((out / "report.json").read_text())["original_model"]["path"] == other.name  # not where


def test_item3_non_bundle_folder_is_refused_before_any_backend_run(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    assert _reduce_example(out) == 2
    assert "not a graphbisect bundle" in capsys.readouterr().err
    assert not work_dir_for(out).exists()  # refused up front: no oracle capture, no target run
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_item3_second_run_on_the_same_output_stops_at_once(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bug"
    with folder_lock(work_dir_for(out), what="a reduction"):  # another run holds -o
        assert _reduce_example(out) == 2
    assert "in use by another process" in capsys.readouterr().err
    assert not out.exists()
    assert sorted(p.name for p in work_dir_for(out).iterdir()) == ["lock"]  # nothing ran


# --- item 6: a downloaded bundle does not run code it names, and damage is called damage ------------------
@pytest.mark.parametrize("spec", ["command:cmd=touch {marker},shell=1", "onnxruntime:python={python}"])
def test_item6_verify_does_not_run_a_program_the_bundle_names_without_trust(
        spec: str, example_bundle: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bundle = _copy(example_bundle, tmp_path)
    marker = tmp_path / "pwned"
    fake_python = tmp_path / "python"  # an "interpreter" shipped by the bundle's author
    fake_python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake_python.chmod(0o755)
    report = json.loads((bundle / "report.json").read_text())
    report["target"] = spec.format(marker=marker, python=fake_python)
    (bundle / "report.json").write_text(json.dumps(report))
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "--trust" in err and not marker.exists()
    main(["verify", str(bundle), "--trust"])  # the user read it and trusts it: it runs
    assert marker.exists()


@pytest.mark.parametrize("damage", ["truncate model", "edit outputs", "remove target outputs"])
def test_item6_damaged_bundle_is_damaged_not_a_different_failure(damage: str, example_bundle: Path, tmp_path: Path,
                                                                 capsys) -> None:  # type: ignore[no-untyped-def]
    bundle = _copy(example_bundle, tmp_path)
    if damage == "truncate model":
        data = (bundle / "model.onnx").read_bytes()
        (bundle / "model.onnx").write_bytes(data[: len(data) // 2])
    elif damage == "edit outputs":
        outputs = dict(np.load(bundle / "oracle_outputs.npz"))
        np.savez(bundle / "oracle_outputs.npz", **{k: v + 1 for k, v in outputs.items()})
    else:
        (bundle / "target_outputs.npz").unlink()
    assert main(["verify", str(bundle)]) == 2
    assert "is damaged" in capsys.readouterr().err


# --- item 5: the first Ctrl-C stops the whole run, keeps the best result and says how to resume ------------
def test_item5_ctrl_c_stops_the_run_and_prints_the_resume_line(tmp_path: Path) -> None:
    host = host_network(400, bug="layernorm_keepdims0", position="branch", seed=2)
    onnx.save(host.model, tmp_path / "m.onnx")
    save_inputs(tmp_path / "in.npz", host.inputs)
    out = tmp_path / "out dir"  # a space: the printed command must be shell-quoted (item 9)
    cmd = [sys.executable, "-m", "graphbisect", "reduce", str(tmp_path / "m.onnx"), "--inputs",
           str(tmp_path / "in.npz"), "--no-layerwise", "-o", str(out)]
    # Ctrl-C as a terminal delivers it: a suite started in the background (`bash .ci/run &`) runs with SIGINT
    # ignored, which a child inherits through exec, and then never sees it; a handler is reset to the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": _ROOT})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until the search runs (no layerwise hints: bisection, then ProbDD)
        if line.startswith("[reduce]"):  # the progress bar's first event: the search has begun
            break
    # Sent now (the search lasts ~0.4 s here); the later steps are covered by the in-process test below.
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    stopped_after = time.monotonic() - sent
    # the best result so far is bundled, and the exit code says Ctrl-C (130, as the README promises): a CI job
    # must not read an interrupted run as a finished one
    assert proc.returncode == 130, stdout + stderr
    assert "NOT PROVEN (interrupted)" in stdout
    assert f"Resume: graphbisect reduce --resume {shlex.quote(str(out))}" in stdout
    assert stopped_after < 10, f"the run went on for {stopped_after:.1f} s after Ctrl-C"
    resumed = subprocess.run([*cmd[:4], "--resume", str(out)], capture_output=True, text=True, timeout=300,
                             check=False, env={**os.environ, "PYTHONPATH": _ROOT})
    assert resumed.returncode == 1 and "1-minimal: yes" in resumed.stdout, resumed.stdout + resumed.stderr


@pytest.mark.parametrize("when", ["progress", "re-verifying", "finding the lowest optimization level"])
def test_item5_ctrl_c_at_any_step_after_the_search_began_keeps_the_best_result(when: str, tmp_path: Path) -> None:
    # Ctrl-C raises KeyboardInterrupt wherever the main thread is; the callbacks raise it at three points that
    # escaped before: the progress bar's first event (before the search's own handler), the re-verification
    # and the maintainer facts' runs. Each lost the run's result (exit 130) though the search had begun or ended.
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model

    host = host_network(100, bug="layernorm_keepdims0", position="branch", seed=2)
    model = load_model(host.model)
    raised: list[str] = []

    def interrupt(text: str) -> None:
        if not raised and text.startswith(when):
            raised.append(text)
            raise KeyboardInterrupt

    try:
        result = reduce_model(model, tmp_path / "bug", inputs=host.inputs, options=ReduceOptions(layerwise=False),
                              on_stage=interrupt, on_progress=lambda _event: interrupt("progress"))
    except KeyboardInterrupt:
        pytest.fail(f"Ctrl-C at {when!r} escaped reduce_model: the run's result was lost")
    assert raised and result.failed and result.bundle is not None and is_bundle(result.bundle)
    report = json.loads((result.bundle / "report.json").read_text())
    if when == "finding the lowest optimization level":  # the result was re-verified; later facts were not measured
        assert result.one_minimal and result.verified and report["interrupted"] is True
        assert "optimization_levels" not in report and "spec_check" in report
    else:
        assert result.stop_reason == "interrupted" and not result.one_minimal and not result.verified
        assert any("interrupted (Ctrl-C)" in note for note in result.notes)


# --- item 8: NaN inputs that make both sides NaN are a warning, not a silent PASS with cosine 1 -----------
def _nan_model(tmp_path: Path, size: int) -> tuple[Path, Path]:
    graph = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [size])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [size])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.full(size, np.nan, np.float32))
    return model, inputs


@pytest.mark.parametrize("command", ["compare", "reduce"])
def test_item8_nan_inputs_and_all_nan_outputs_are_warned_about(command: str, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = _nan_model(tmp_path, size=5 if command == "compare" else 6)  # distinct warnings
    extra = ["--no-layerwise"] if command == "compare" else ["-o", str(tmp_path / "out")]
    with caplog.at_level("WARNING"):
        assert main([command, str(model), "--inputs", str(inputs), *extra]) == 0  # the backends agree...
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("input 'x' holds" in w and "NaN" in w for w in warnings), warnings
    assert any("output 'y' is NaN/Inf in all" in w for w in warnings), warnings  # ...on nothing


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The -o folder of a reduction stopped early (resumable): its DIR.work is kept."""
    out = tmp_path_factory.mktemp("interrupted") / "bug"
    assert _reduce_example(out, "--max-invocations", "1") == 1
    return out


@pytest.mark.parametrize("changed", [["--atol", "0.5"], ["--target", "onnxruntime:opt_level=basic"], ["other model"]])
def test_item9_resume_refuses_a_different_model_or_options(changed: list[str], interrupted: Path, tmp_path: Path,
                                                           capsys) -> None:  # type: ignore[no-untyped-def]
    if changed == ["other model"]:
        other = _external_add_model(tmp_path / "m", "w.bin")
        (tmp_path / "m" / "w.bin").write_bytes(np.zeros(4, np.float32).tobytes())
        changed = [str(other)]
    journal = (work_dir_for(interrupted) / "journal.jsonl").read_bytes()
    assert main(["reduce", "--resume", str(interrupted), *changed]) == 2
    assert "continues the recorded reduction" in capsys.readouterr().err
    assert (work_dir_for(interrupted) / "journal.jsonl").read_bytes() == journal  # nothing ran


def test_item9_resume_with_the_recorded_values_given_again_continues(interrupted: Path, tmp_path: Path) -> None:
    out = tmp_path / "bug"
    shutil.copytree(interrupted, out)
    shutil.copytree(work_dir_for(interrupted), work_dir_for(out))
    assert main(["reduce", "--resume", str(out), "--atol", "1e-4", "--target", "ort:opt_level=all"]) == 1


def test_item9_zero_node_model_gets_a_clear_error_not_a_bug_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "zero.onnx")
    assert main(["reduce", str(tmp_path / "zero.onnx"), "-o", str(tmp_path / "out"), "--check", "false"]) == 2
    err = capsys.readouterr().err
    assert "has no nodes" in err and "graphbisect bug" not in err


@pytest.mark.parametrize("command", ["compare", "precision"])
def test_item9_workdir_in_the_models_folder_never_overwrites_the_model(command: str, tmp_path: Path,
                                                                      capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "mine"
    folder.mkdir()
    model = folder / "model.onnx"
    shutil.copy(example_model_path(), model)
    before = model.read_bytes()
    args = [command, str(model), "--inputs", str(example_inputs_path()), "--workdir", str(folder)]
    assert main(args) == 2
    assert "could overwrite yours" in capsys.readouterr().err
    assert model.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["model.onnx"]


def test_item9_trtexec_flags_are_shell_quoted(tmp_path: Path) -> None:
    hostile = 'a b;touch $HOME/x "q"'  # a "'" trtexec cannot take at all (issue 36): tests/cli/test_name_injection.py
    line = PrecisionOverrides("fp16", keep_fp32=(hostile, "ln/Pow"), keep_op_types=(), lowered=()).trtexec()
    words = shlex.split(line)  # what a shell passes to trtexec
    assert f"--layerPrecisions={hostile}:fp32,ln/Pow:fp32" in words
    assert f"--layerOutputTypes={hostile}:fp32,ln/Pow:fp32" in words


def _renamed_host(tmp_path: Path, node_suffix: str, tensor_suffix: str = "") -> tuple[Path, Path]:
    host = host_network(100, bug="layernorm_keepdims0", seed=1)
    model = host.model
    outputs = {o.name for o in model.graph.output}
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}{node_suffix}"
        for slots in (node.input, node.output):
            for j, name in enumerate(slots):
                if name and tensor_suffix and name not in outputs and name not in host.inputs and \
                        name not in {init.name for init in model.graph.initializer}:
                    slots[j] = name + tensor_suffix
    onnx.save(model, tmp_path / "m.onnx")
    save_inputs(tmp_path / "in.npz", host.inputs)
    return tmp_path / "m.onnx", tmp_path / "in.npz"


def test_item9_control_characters_in_names_are_escaped_on_the_terminal_and_exact_in_files(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    hostile = "\x1b]0;pwned\x07\x1b[2J\u202e"
    model, inputs = _renamed_host(tmp_path, hostile)
    assert main(["reduce", str(model), "--inputs", str(inputs), "-o", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert "\x1b" not in stream and "\x07" not in stream and "\u202e" not in stream
    assert "\\x1b]0;pwned\\x07" in captured.out  # shown, escaped
    kept = json.loads((tmp_path / "out" / "report.json").read_text())["kept_nodes"]
    assert kept and all(k["name"].endswith(hostile) for k in kept)  # exact in files


def test_item9_nul_in_tensor_names_is_a_clear_error_not_an_abort_mid_run(tmp_path: Path) -> None:
    model, _ = _renamed_host(tmp_path, "", tensor_suffix="\x00x")
    with pytest.raises(ModelError, match="NUL character"):
        load_model(model)


# --- inputs audit: an oracle that crashes on the input values is not told to be replaced by itself -------------
def _gather_from_input_table(tmp_path: Path) -> Path:
    """``table: float[N, 4]`` (a graph input, so the row count is unknown) gathered by ``ids: int64[5]``:
    seeded random ids are drawn from [0, 10) and N from the batch rule (1), so the index is out of range."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup", axis=0)], "g",
                              [vi("table", onnx.TensorProto.FLOAT, ["N", 4]), vi("ids", onnx.TensorProto.INT64, [5])],
                              [vi("rows", onnx.TensorProto.FLOAT, None)])
    path = tmp_path / "lookup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("oracle", ["onnxruntime:opt_level=disable", "reference"])
@pytest.mark.parametrize("command", ["compare", "reduce", "passes", "precision"])
def test_oracle_crash_on_random_inputs_points_at_the_inputs_not_at_the_oracle(
        command: str, oracle: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Each oracle crashes on the random ids (index out of bounds); the hint said "choose another oracle, e.g.
    # --oracle reference or --oracle onnxruntime:opt_level=disable" — the one that just failed, and the other
    # crashes alike — and never that the inputs were random and real ones are given with --inputs.
    out = ["-o", str(tmp_path / "bug")] if command in ("reduce", "passes") else []
    assert main([command, str(_gather_from_input_table(tmp_path)), "--oracle", oracle, *out]) == 2
    err = capsys.readouterr().err
    assert "out of" in err and "bounds" in err  # the oracle's own message is shown
    hint = err.split("hint:", 1)[1]
    assert "--inputs" in hint and "random" in hint
    assert f"--oracle {oracle}" not in hint
