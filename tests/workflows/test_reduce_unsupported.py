"""`reduce` on a model the target refuses as unsupported: ONNX Runtime's CPU provider has no bfloat16 `Add`.

Before: the refusal was reduced and reported as a crash ("crash-load", "crashes on `model.onnx`"), though
`compare` called the same run ``target-unsupported``. Now the signature, the report, the JSON, the CLI lines,
`repro.py` and `graphbisect verify` say "unsupported", and a candidate counts only when it is refused the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.backends.base import Phase, RunResult, RunStatus
from graphbisect.cli.main import main
from graphbisect.oracle.signature import FailureKind, signature_of


def _bf16_add_model(path: Path) -> Path:
    """relu → Cast(bfloat16) → Add → Cast(float) → sigmoid: ORT's CPU provider has no bfloat16 Add kernel."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["a"], name="to_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("Add", ["a", "a"], ["b"], name="add_bf16"),
             helper.make_node("Cast", ["b"], ["c"], name="to_f32", to=TensorProto.FLOAT),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


def test_a_refused_model_reduces_to_the_refused_node_and_is_reported_as_unsupported(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _bf16_add_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.array([1.0, -2.0, 0.5, 3.0], np.float32))
    out = tmp_path / "bug"
    code = main(["reduce", str(model), "--inputs", str(tmp_path / "in.npz"), "--oracle", "reference",
                 "--target", "onnxruntime", "-o", str(out), "--json", str(tmp_path / "r.json")])
    printed = capsys.readouterr().out
    assert code == 1, printed  # a failure was found: the target refuses the model
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["signature"]["kind"] == "unsupported", data["signature"]
    assert "Could not find an implementation for Add(14)" in data["signature"]["detail"]
    assert data["kept_nodes"] == ["add_bf16"] and data["one_minimal"] and data["verified"]
    assert "failure: unsupported (" in printed and "crash-" not in printed
    report = (out / "report.md").read_text()
    title = report.split("\n\n")[0] + report.split("\n\n")[1]
    assert "unsupported" in title and "refuses `model.onnx` as unsupported" in title and "crash" not in title
    assert json.loads((out / "repro_config.json").read_text())["expect"]["kind"] == "unsupported"
    repro = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True, text=True, timeout=120,
                           check=False)
    assert repro.returncode == 1 and "observed  unsupported: " in repro.stdout, repro.stdout + repro.stderr
    assert "REPRODUCED" in repro.stdout and "(unsupported)" in repro.stdout
    assert main(["verify", str(out), "--json", str(tmp_path / "v.json")]) == 1
    assert json.loads((tmp_path / "v.json").read_text())["outcome"] == "reproduces"
    # A bundle written before the "unsupported" kind recorded the refusal as a crash: it still reproduces
    # (read under the current rule), not "a different failure".
    report = json.loads((out / "report.json").read_text())
    report["signature"]["kind"] = "crash-load"
    (out / "report.json").write_text(json.dumps(report))
    assert main(["verify", str(out), "--json", str(tmp_path / "legacy.json")]) == 1
    legacy = json.loads((tmp_path / "legacy.json").read_text())
    assert legacy["outcome"] == "reproduces" and legacy["recorded"]["kind"] == "unsupported", legacy


def test_a_refusal_and_a_crash_with_the_same_words_do_not_match() -> None:
    """The "same way" check: a candidate refused as unsupported is not the baseline crash, nor the reverse."""
    message = "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Add(14) node"
    refused = signature_of(RunResult(RunStatus.CRASH, phase=Phase.LOAD, error_type="NotImplemented",
                                     message=message), None)
    crashed = signature_of(RunResult(RunStatus.CRASH, phase=Phase.LOAD, error_type="Fail",
                                     message="Unexpected data type for Clip 'min' input of 11"), None)
    assert refused.kind is FailureKind.UNSUPPORTED and crashed.kind is FailureKind.CRASH_LOAD
    assert refused.matches(refused) and not refused.matches(crashed) and not crashed.matches(refused)


def test_a_programs_stderr_does_not_make_its_exit_a_refusal(tmp_path: Path) -> None:
    """A command's stderr (the second paragraph of its message, outside the signature's detail) saying "not
    supported" leaves its failure a crash: the kind may only depend on what the detail keeps, else candidates
    whose programs print different stderr would stop matching the baseline."""
    from graphbisect.backends import BackendProcess

    model = _bf16_add_model(tmp_path / "m.onnx")
    script = tmp_path / "check.py"
    script.write_text("import sys\nprint('mode 7 is not supported for', sys.argv[1], file=sys.stderr)\nsys.exit(3)\n")
    spec = f"command:cmd={sys.executable} {script} {{model}} {{inputs}}"
    with BackendProcess(spec, workdir=tmp_path / "w") as proc:
        run = proc.run(model, {"x": np.zeros(4, np.float32)})
    assert not run.ok and "not supported" in (run.message or ""), run.message
    assert signature_of(run, None).kind is FailureKind.CRASH_RUN
