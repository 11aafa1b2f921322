"""repro.py: reproduces real ORT bugs (exit 1), says fixed (exit 0), cannot run (exit 2), and never executes names."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from artifacts_builders import (
    CLIP_INPUT,
    FIXED_TARGET,
    HOSTILE,
    LN_INPUT,
    MISMATCH_TARGET,
    ORACLE,
    build_content,
    layernorm_argmax_model,
    relu_clip_model,
    run_repro,
)

from graphbisect.artifacts import BundleContent, crash_key, load_bundle, render_repro, write_bundle
from graphbisect.artifacts.report import md_code
from graphbisect.artifacts.repro import expected_failure, repro_config
from graphbisect.backends import BackendSpec
from graphbisect.backends.base import RunResult, RunStatus
from graphbisect.compare import Tolerance, compare_outputs
from graphbisect.oracle.signature import (
    EXACT_ROOTED,
    EXACT_VALUES,
    FLOAT_VALUES,
    FailureKind,
    Signature,
    crash_names,
    signature_of,
)
from graphbisect.workflows.verify import DIFFERENT, REPRODUCES, UNDECIDED, verify_bundle

FIXED = BackendSpec.parse(FIXED_TARGET)

pytest.importorskip("onnxruntime")  # every bundle here comes from real ONNX Runtime runs


def _fixed(content: BundleContent) -> BundleContent:
    """The same bundle, but recorded against a target that does not have the bug."""
    return dataclasses.replace(content, target=FIXED)


def test_mismatch_reproduces_then_fixed(mismatch_content: BundleContent, tmp_path: Path) -> None:
    proc = run_repro(write_bundle(mismatch_content, tmp_path / "bug"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout
    assert 'MISMATCH  "y"' in proc.stdout and "elements beyond tolerance" in proc.stdout
    fixed = run_repro(write_bundle(_fixed(mismatch_content), tmp_path / "fixed"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "FIXED" in fixed.stdout and 'ok        "y"' in fixed.stdout


def test_crash_reproduces_then_fixed(crash_content: BundleContent, tmp_path: Path) -> None:
    bug = write_bundle(crash_content, tmp_path / "bug")
    proc = run_repro(bug)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout and "Unexpected data type for Clip 'min' input of 11" in proc.stdout
    in_process = run_repro(bug, "--in-process")
    assert in_process.returncode == 1 and "REPRODUCED" in in_process.stdout
    fixed = run_repro(write_bundle(_fixed(crash_content), tmp_path / "fixed"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "FIXED" in fixed.stdout


def test_same_options_as_the_spec(mismatch_content: BundleContent) -> None:
    """The script gets what graphbisect's ORT runtime derives from the spec."""
    spec = BackendSpec.parse("ort:opt_level=extended,threads=2,disabled=LayerNormFusionL1,"
                             "config=session.disable_prepacking=1,providers=CPUExecutionProvider,timeout=30")
    config = repro_config(dataclasses.replace(mismatch_content, target=spec))
    assert config["options"] == {
        "providers": ["CPUExecutionProvider"], "provider_options": {},
        "graph_optimization_level": "ORT_ENABLE_EXTENDED",
        "disabled_optimizers": ["LayerNormFusionL1"], "intra_op_num_threads": 2,
        # the runtime's default first (idle threads block: backends/onnxruntime.py "No spinning"), then the spec's
        "session_config": [["session.intra_op.allow_spinning", "0"], ["session.disable_prepacking", "1"]],
    }
    assert config["timeout_seconds"] == 30.0 and config["target_spec"] == str(spec)


def test_a_different_failure_is_loud(crash_content: BundleContent, tmp_path: Path) -> None:
    """Recorded: a crash. Now: wrong values (the expected outputs are tampered with) → exit 1, DIFFERENT."""
    tampered = dataclasses.replace(_fixed(crash_content), signature=crash_content.signature,
                                   oracle_outputs={"y": np.full(4, 7.0)})
    proc = run_repro(write_bundle(tampered, tmp_path / "b"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "A DIFFERENT FAILURE" in proc.stdout and "now mismatch" in proc.stdout


def test_a_mismatch_of_another_value_class_is_a_different_failure(tmp_path: Path) -> None:
    """The value class is part of a mismatch's signature (Signature.matches): repro.py reported REPRODUCED for
    an integer flip when float values beyond tolerance were recorded, and the other way round, while
    `graphbisect verify` said DIFFERENT. Both ways, with real ONNX Runtime runs."""
    content = build_content(layernorm_argmax_model(), {"x": LN_INPUT}, tmp_path / "ln", target=MISMATCH_TARGET)
    assert content.signature == Signature(FailureKind.MISMATCH, FLOAT_VALUES, content.signature.band)
    # Recorded: floats beyond tolerance. Now: the floats agree (the fixed target), the argmax differs.
    flipped = dict(content.oracle_outputs, idx=(content.oracle_outputs["idx"] + 1) % 4)
    cases = {"flip": (dataclasses.replace(_fixed(content), oracle_outputs=flipped), EXACT_VALUES),
             # Recorded: an integer flip. Now: the floats are wrong, the argmax agrees.
             "float": (dataclasses.replace(content, signature=Signature(FailureKind.MISMATCH, EXACT_VALUES)),
                       FLOAT_VALUES)}
    for name, (case, observed) in cases.items():
        out = write_bundle(case, tmp_path / name)
        proc = run_repro(out)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "A DIFFERENT FAILURE" in proc.stdout and f"now mismatch ({observed})" in proc.stdout, proc.stdout
        with load_bundle(out) as bundle:
            verification = verify_bundle(bundle)
        assert verification.audit is not None and verification.audit["verdict"] == DIFFERENT  # graphbisect's search
        # the flip is only in the tampered oracle outputs: the checker's plain oracle run refutes it
        assert verification.outcome == (UNDECIDED if name == "flip" else DIFFERENT), verification.audit
    same = run_repro(write_bundle(content, tmp_path / "same"))
    assert same.returncode == 1 and "REPRODUCED" in same.stdout, same.stdout + same.stderr


def test_a_failure_rooted_in_integers_reproduces_in_either_value_class(tmp_path: Path) -> None:
    """Recorded: a float error whose first divergence was an integer tensor (reduce's EXACT_ROOTED baseline).
    The bundle may end where the integers go wrong, or keep their float consequence: repro.py and `graphbisect
    verify` both say it reproduces with the argmax flipped and with the floats beyond tolerance (main: repro.py
    had no such class, and verify matched the detail strings exactly)."""
    content = build_content(layernorm_argmax_model(), {"x": LN_INPUT}, tmp_path / "ln", target=MISMATCH_TARGET)
    rooted = dataclasses.replace(content, signature=Signature(FailureKind.MISMATCH, EXACT_ROOTED))
    flipped = dict(content.oracle_outputs, idx=(content.oracle_outputs["idx"] + 1) % 4)
    cases = {"flip": (dataclasses.replace(_fixed(rooted), oracle_outputs=flipped), EXACT_VALUES),
             "float": (rooted, FLOAT_VALUES)}
    for name, (case, observed) in cases.items():
        out = write_bundle(case, tmp_path / name)
        proc = run_repro(out)
        assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
        assert f"mismatch ({observed})" in proc.stdout, proc.stdout
        with load_bundle(out) as bundle:
            verification = verify_bundle(bundle)
        assert verification.audit is not None and verification.audit["verdict"] == REPRODUCES  # the search's
        # the flip is only in the tampered oracle outputs: the checker's plain oracle run refutes it
        assert verification.outcome == (UNDECIDED if name == "flip" else REPRODUCES), verification.audit
    module = _script_module(rooted, tmp_path)  # the script words the classes as the signature does
    assert (module.FLOAT_VALUES, module.EXACT_VALUES, module.EXACT_ROOTED) == (FLOAT_VALUES, EXACT_VALUES,
                                                                                EXACT_ROOTED)


def test_cannot_run_exits_2(mismatch_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "b")
    (out / "model.onnx").unlink()
    proc = run_repro(out)
    assert proc.returncode == 2 and "model.onnx is missing" in proc.stderr
    config = json.loads((out / "repro_config.json").read_text())
    (out / "repro_config.json").write_text("{broken")
    assert run_repro(out).returncode == 2
    assert config["backend"] == "onnxruntime"


def test_hostile_names_are_data_never_code(hostile_content: BundleContent, mismatch_content: BundleContent,
                                           tmp_path: Path) -> None:
    out = write_bundle(hostile_content, tmp_path / "bundle")
    script = (out / "repro.py").read_text()
    assert script == render_repro(mismatch_content)  # constant per backend: no name is in the text
    for name in HOSTILE.values():
        assert name not in script
    proc = run_repro(out, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.dumps(HOSTILE["y"]) in proc.stdout  # names are printed escaped
    pwned = [p for p in tmp_path.rglob("PWNED*")] + [p for p in Path.cwd().glob("PWNED*")]
    assert pwned == []
    report = (out / "report.md").read_text()
    # Names are code spans (verbatim, never HTML or markdown); table cells escape '|' and newlines.
    assert f"| {md_code(HOSTILE['sq'], in_table=True)} |" in report
    assert "\n" not in md_code(HOSTILE["x"], in_table=True) and HOSTILE["var"] not in report
    assert all("<script>" in md_code(HOSTILE["sq"], in_table=True) for line in report.splitlines()
               if "<script>" in line)
    config = json.loads((out / "repro_config.json").read_text())
    assert config["inputs"] == [HOSTILE["x"]] and config["outputs"] == [HOSTILE["y"]]


def _script_module(content: BundleContent, tmp_path: Path) -> ModuleType:
    path = tmp_path / "repro_module.py"
    path.write_text(render_repro(content))
    spec = importlib.util.spec_from_file_location("repro_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("message", [
    "Fail: [ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/core/optimizer/relu_clip_fusion.cc:83 bad 0x7ffe12",
    "RuntimeError: cannot open /tmp/tmpab12cd34/candidate_17.onnx (pid 123456)\nsecond line",
    "  \n\tCommandFailed: command exited with code 3\n boom",
    "",
    "RuntimeError: Exception from src/inference/src/cpp/core.cpp:84:\nCheck 'false' failed at src/x.cpp:151:\n"
    "-- Conv-16 with a message:\nThe input data tensor's rank has to be known (static)\n\n-- ReduceMean-16 with a",
    "RuntimeError: Unable to find output name 'cn' in ['', 'a', \"b\"], proto is\nir_version: 8\ngraph {",
    "RuntimeError: Exception from src/core.cpp:132:\nWhile validating node 'opset8::If If_5381 (opset1::Greater "
    "/gt[0]:boolean[1,1], opset1::Relu /relu[0]:f32[1,4]) -> ()' with friendly_name 'If_5381':\nRank of If ...",
    "InvalidArgument: Got invalid dimensions for input: x.1 for the following indices\n index: 1 Got: 4",
])
def test_script_crash_key_equals_the_library_one(mismatch_content: BundleContent, tmp_path: Path,
                                                 message: str) -> None:
    """Names included: the script embeds graphbisect.oracle.names and gets the model's names in its config."""
    module = _script_module(mismatch_content, tmp_path)
    assert module.crash_key(message) == crash_key(message)
    names = crash_names(["x.1", "/relu", "relu_clip_fusion.cc.x"])
    assert module.crash_key(message, names) == crash_key(message, names)


def test_the_control_is_judged_as_the_recorded_failure_is(mismatch_content: BundleContent, tmp_path: Path) -> None:
    """The control run (culprit passes disabled) said "CONTROL PASSES" whenever its outputs matched: of a
    --fail-regex failure whose line it still printed, and of a Python check's failure it cannot judge."""
    module = _script_module(mismatch_content, tmp_path)
    regex = {"expect": {"kind": "regex", "regex": "fell back"}}
    printed = {"kind": "none", "outputs": [], "log": "W: fell back to a slow kernel"}
    assert module.control_verdict(regex, printed).startswith("CONTROL FAILS (regex)")
    assert module.control_verdict(regex, dict(printed, log="")).startswith("CONTROL PASSES")
    assert module.control_verdict(regex, dict(printed, log=""), in_process=True).startswith("CONTROL NOT JUDGED")
    check = {"expect": {"kind": "mismatch", "detail": FLOAT_VALUES}, "judge": "python-check"}
    assert module.control_verdict(check, {"kind": "none", "outputs": []}).startswith("CONTROL UNDECIDED")
    tolerance = {"expect": {"kind": "mismatch", "detail": FLOAT_VALUES}, "judge": "tolerance"}
    assert module.control_verdict(tolerance, {"kind": "none", "outputs": []}).startswith("CONTROL PASSES")


def test_script_value_classes_equal_the_signature_ones(mismatch_content: BundleContent, tmp_path: Path) -> None:
    """repro.py words a mismatch's value class as graphbisect's signature does (its config's expected detail)."""
    module = _script_module(mismatch_content, tmp_path)
    tolerance = repro_config(mismatch_content)["tolerance"]
    for dtype in ("bool", "int8", "uint64", "float16", "float32", "complex64"):
        expected, actual = np.zeros(3, dtype), np.ones(3, dtype)
        library = signature_of(RunResult(RunStatus.OK, {"o": actual}),
                               compare_outputs({"o": expected}, {"o": actual}, Tolerance()))
        results = [module.compare("o", expected, actual, tolerance)]
        assert module.failure_kind(results) == library.kind.value == "mismatch"
        assert module.mismatch_detail(results) == library.detail, dtype


def test_crash_key_ignores_volatile_details() -> None:
    a = crash_key("Fail: /a/b/relu_clip_fusion.cc:83 Unexpected type in /tmp/w/candidate_3.onnx at 0xdeadbeef")
    b = crash_key("Fail: /c/relu_clip_fusion.cc:91 Unexpected type in /x/model.onnx at 0x1234")
    assert a == b == "Fail: relu_clip_fusion.cc Unexpected type in model.onnx at 0x?"


def test_expected_failure_of_a_worker_death() -> None:
    died = Signature(FailureKind.CRASH_RUN, "SIGSEGV: the worker process was killed by signal SIGSEGV (11) during run")
    assert expected_failure(died)["exit_code"] == -11
    exited = Signature(FailureKind.CRASH_LOAD, "WorkerExit: the worker process exited with code 3 during load")
    assert expected_failure(exited)["exit_code"] == 3
    assert expected_failure(Signature(FailureKind.CRASH_RUN, "exit 7"))["exit_code"] == 7
    raised = expected_failure(Signature(FailureKind.CRASH_LOAD, "Fail: x.cc:3 bad"), "Fail: /s/x.cc:3 bad\n\nmore")
    assert raised["exit_code"] is None and raised["message_key"] == "Fail: x.cc bad"


def _patched_bundle(content: BundleContent, folder: Path, load_target: str, expect: dict[str, object],
                    timeout: float = 600.0) -> Path:
    """A bundle whose repro.py has its load_target replaced (to die or hang like a broken backend would)."""
    out = write_bundle(content, folder)
    script = (out / "repro.py").read_text()
    script = script.replace('\nif __name__ == "__main__":', f"\n{load_target}\n\nif __name__ == \"__main__\":")
    (out / "repro.py").write_text(script)
    config = json.loads((out / "repro_config.json").read_text())
    config["expect"] = expect
    config["timeout_seconds"] = timeout
    (out / "repro_config.json").write_text(json.dumps(config))
    return out


def test_a_segfault_in_the_backend_is_observed(crash_content: BundleContent, tmp_path: Path) -> None:
    die = "def load_target(model_path, options):\n    os.kill(os.getpid(), signal.SIGSEGV)"
    expect = {"kind": "crash-load", "detail": "SIGSEGV: ...", "exit_code": -11}
    proc = run_repro(_patched_bundle(crash_content, tmp_path / "segv", die, expect))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout and "SIGSEGV" in proc.stdout
    other = run_repro(_patched_bundle(crash_content, tmp_path / "abrt", die.replace("SIGSEGV", "SIGABRT"), expect))
    assert other.returncode == 1 and "A DIFFERENT FAILURE" in other.stdout  # same kind, other exit status
    assert "REPRODUCED" not in other.stdout


def test_a_hang_is_a_timeout(crash_content: BundleContent, tmp_path: Path) -> None:
    hang = "def load_target(model_path, options):\n    import time\n    time.sleep(60)"
    out = _patched_bundle(crash_content, tmp_path / "hang", hang, {"kind": "timeout", "detail": ""}, timeout=1.0)
    proc = run_repro(out)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr


def _command_content(tmp_path: Path, tool: str) -> BundleContent:
    script = tmp_path / f"{tool}.py"
    body = {
        "broken": "sys.stderr.write('boom: Clip with double bounds is not supported\\n'); sys.exit(3)",
        "good": "np.savez(sys.argv[3], y=np.clip(np.maximum(x, 0), 0, 6))",
    }[tool]
    script.write_text("import sys\nimport numpy as np\nx = np.load(sys.argv[2])['x']\n" + body + "\n")
    target = f"command:cmd={sys.executable} {script} {{model}} {{inputs}} {{outputs}}"
    return build_content(relu_clip_model(), {"x": np.array([-1.0, 0.5, 3.0, 9.0])}, tmp_path / tool,
                         oracle=ORACLE, target=target)


def test_command_target(tmp_path: Path) -> None:
    broken = _command_content(tmp_path, "broken")
    assert broken.signature.detail == "CommandFailed: command exited with code 3"
    proc = run_repro(write_bundle(broken, tmp_path / "bug"), "--trust")  # a command's program runs only trusted
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    good = _command_content(tmp_path, "good")
    assert not good.signature.failed
    fixed = dataclasses.replace(good, signature=broken.signature, target_message=broken.target_message)
    proc = run_repro(write_bundle(fixed, tmp_path / "fixed"), "--trust")
    assert proc.returncode == 0 and "FIXED" in proc.stdout, proc.stdout + proc.stderr


def test_a_command_targets_environment_is_applied_by_repro(tmp_path: Path, ort_release_pythons: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``venv=``: the program runs with that environment first on PATH in repro.py too, so ``python`` is its own
    (a check that fails on the ONNX Runtime release it imports, 1.20.1 there); without it, repro.py would run
    another interpreter's and see another failure."""
    venv = ort_release_pythons["1.20.1"].parent.parent
    (tmp_path / "check.py").write_text("import sys\nimport onnxruntime\n"
                                       "sys.exit(3 if onnxruntime.__version__ == '1.20.1' else 0)\n")
    monkeypatch.chdir(tmp_path)  # where the command runs, graphbisect's and repro.py's
    content = build_content(relu_clip_model(), {"x": CLIP_INPUT}, tmp_path / "case", oracle=ORACLE,
                            target=f"command:cmd=python check.py {{model}} {{inputs}},venv={venv},package=onnxruntime")
    assert content.signature.detail == "CommandFailed: command exited with code 3"
    out = write_bundle(content, tmp_path / "bug")
    config = json.loads((out / "repro_config.json").read_text())
    assert config["options"]["venv"] == str(venv)
    assert (config["library"], config["recorded_library_version"]) == ("onnxruntime", "1.20.1")
    proc = run_repro(out, "--trust", cwd=tmp_path)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    # package=: the release the command's python has is measured and printed, as graphbisect reported it; run
    # against another release's environment, the script says which one ran and which one recorded the failure
    assert "(onnxruntime 1.20.1)" in proc.stdout and "recorded with" not in proc.stdout, proc.stdout
    config["options"]["venv"] = str(ort_release_pythons["1.22.1"].parent.parent)
    (out / "repro_config.json").write_text(json.dumps(config))
    other = run_repro(out, "--trust", cwd=tmp_path)
    assert other.returncode == 0 and "FIXED" in other.stdout, other.stdout + other.stderr
    assert "(onnxruntime 1.22.1)" in other.stdout, other.stdout
    assert "(the failure was recorded with onnxruntime 1.20.1)" in other.stdout, other.stdout


def test_an_external_check_bundle_is_judged_by_its_exit_status(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A `reduce --check CMD` bundle (a command without {outputs}): the reduction judged the exit status only.
    Once the check exits 0, repro.py and `graphbisect verify` said "A DIFFERENT FAILURE" (they asked the check
    for outputs it never writes); now they say FIXED, as the reduction would have."""
    script = tmp_path / "check.py"
    script.write_text("import os, sys\nsys.stderr.write('max diff 1.24\\n')\nsys.exit(int(os.environ['EXIT']))\n")
    target = f"command:cmd={sys.executable} {script} {{model}} {{inputs}}"
    monkeypatch.setenv("EXIT", "1")  # the check fails: the recorded failure
    monkeypatch.delenv("PYTHONPATH", raising=False)  # repro.py must not need graphbisect
    content = build_content(relu_clip_model(), {"x": CLIP_INPUT}, tmp_path / "case", oracle=ORACLE, target=target)
    assert content.signature.detail == "CommandFailed: command exited with code 1"
    out = write_bundle(content, tmp_path / "bug")
    # exit 13 is another failure, though "code 1" is a prefix of "code 13" (the status is matched as a number)
    for code, status, words, outcome in (("1", 1, "REPRODUCED", "reproduces"), ("0", 0, "FIXED", "fixed"),
                                         ("13", 1, "A DIFFERENT FAILURE", "different")):
        monkeypatch.setenv("EXIT", code)  # inherited by repro.py and by verify's worker
        proc = run_repro(out, "--trust")  # the check is a program: it runs only trusted
        assert proc.returncode == status and words in proc.stdout, proc.stdout + proc.stderr
        with load_bundle(out) as bundle:
            verification = verify_bundle(bundle, trust=True)
        assert verification.outcome == outcome, verification.to_json()
    assert json.loads((out / "repro_config.json").read_text())["judge"] == "exit-status"
    # The check's program is gone on this machine: python cannot open it (exit 2), which is no failure of the
    # target, reproduced or different (graphbisect's cannot_run rule); it read "A DIFFERENT FAILURE".
    script.unlink()
    proc = run_repro(out, "--trust")
    assert proc.returncode == 2 and "cannot run" in proc.stderr and "can't open file" in proc.stderr, \
        proc.stdout + proc.stderr
    assert "DIFFERENT" not in proc.stdout and "REPRODUCED" not in proc.stdout


def test_repro_needs_no_graphbisect(mismatch_content: BundleContent, tmp_path: Path) -> None:
    """The script imports only the standard library, numpy and the backend library."""
    script = render_repro(mismatch_content)
    assert "graphbisect" not in "".join(line for line in script.splitlines() if "import" in line)
    compile(script, "repro.py", "exec")
    for backend in ("reference", "openvino", "tensorrt", "command:cmd=run {model} {inputs} {outputs}"):
        other = render_repro(dataclasses.replace(mismatch_content, target=BackendSpec.parse(backend)))
        compile(other, f"repro-{backend}.py", "exec")
    assert subprocess.run([sys.executable, "-c", "import ast,sys; ast.parse(sys.stdin.read())"], input=script,
                          text=True, check=False).returncode == 0


@pytest.mark.openvino
def test_openvino_and_reference_scripts(tmp_path: Path) -> None:
    """OpenVINO 2026.4 mis-fuses the same keepdims=0 LayerNorm; the reference evaluator gets it right."""
    pytest.importorskip("openvino")
    from artifacts_builders import LN_INPUT, layernorm_model

    content = build_content(layernorm_model(), {"x": LN_INPUT}, tmp_path / "ov", target="openvino:precision=f32")
    if not content.signature.failed:
        pytest.skip("this OpenVINO does not have the keepdims=0 LayerNorm bug")
    proc = run_repro(write_bundle(content, tmp_path / "ov-bundle"))
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    reference = dataclasses.replace(content, target=BackendSpec.parse("reference"))
    proc = run_repro(write_bundle(reference, tmp_path / "ref-bundle"))
    assert proc.returncode == 0 and "FIXED" in proc.stdout, proc.stdout + proc.stderr


def test_a_broken_library_is_cannot_run(crash_content: BundleContent, tmp_path: Path) -> None:
    """A library that fails to import with something other than ImportError is not the bug: exit 2."""
    broken = "def import_library(options):\n    raise OSError('libonnxruntime.so: cannot open shared object file')"
    out = _patched_bundle(crash_content, tmp_path / "b", broken, {"kind": "crash-load", "detail": "x"})
    proc = run_repro(out)
    assert proc.returncode == 2 and "before the backend ran" in proc.stderr, proc.stdout + proc.stderr


_LOGS_A_WARNING = """\
import sys
import numpy as np
import onnxruntime as ort
model, inputs, outputs = sys.argv[1:4]
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # right values
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
feeds = dict(np.load(inputs))
values = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
np.savez(outputs, **{o.name: v for o, v in zip(session.get_outputs(), values)})
sys.stderr.write("W: fell back to a slow kernel\\n")
"""


def test_a_regex_bundle_in_process_is_not_judged_by_an_uncaptured_log(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--fail-regex matched a line the target's program prints (its outputs are right). repro.py captures the
    backend's output in its child; --in-process leaves it on the terminal, where the regex cannot see it,
    and said "FIXED (regex does not match)" of a run that printed the line."""
    from graphbisect.model import load_model
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model

    script = tmp_path / "logs.py"
    script.write_text(_LOGS_A_WARNING)
    target = f"command:cmd={sys.executable} {script} {{model}} {{inputs}} {{outputs}}"
    monkeypatch.delenv("PYTHONPATH", raising=False)
    result = reduce_model(load_model(relu_clip_model()), tmp_path / "bug", inputs={"x": CLIP_INPUT},
                          options=ReduceOptions(target=target, fail_regex="fell back to a slow kernel"))
    assert result.signature.kind.value == "regex"
    proc = run_repro(tmp_path / "bug", "--trust")  # the target is a program: it runs only trusted
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    proc = run_repro(tmp_path / "bug", "--in-process", "--trust")
    assert "fell back to a slow kernel" in proc.stderr  # printed, on the terminal
    assert proc.returncode == 2 and "NOT JUDGED" in proc.stdout and "FIXED" not in proc.stdout, proc.stdout
