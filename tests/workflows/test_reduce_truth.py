"""`reduce` fails for the same reason as the user's model and never certifies something untrue.

Real fixtures:

* ONNX Runtime's LayerNormFusion fires on a ReduceMean with a *positive* ``axes`` only when the input's rank
  is known (``CheckAxesOnReduceMean``); with an input of unknown rank (as converters write them) only the
  model's ``value_info`` gives it, so the keepdims=0 mis-fusion fails only with that declaration;
* OpenVINO's ONNX frontend refuses ``GlobalLpPool`` on an input whose first dimension is dynamic
  ("First dimension of input data must be static"), which static candidate inputs hide;
* IREE 3.13 miscompiles a BiLSTM fed by an embedding Gather only while the token ids' dimensions are dynamic
  and the LSTM's unused ``Y_h``/``Y_c`` are not outputs (:mod:`tests.declaration_models`);
* a ``--check`` script run by path relative to the caller's directory;
* ONNX Runtime behind ``graphbisect/examples/flaky_target.py``, which crashes or perturbs at random.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphbisect
from graphbisect.backends import BackendProcess
from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.engine import Budget, Evaluator, Outcome, StopReason, probdd
from graphbisect.errors import SpecError
from graphbisect.examples import host_network
from graphbisect.examples.flaky_target import script_path
from graphbisect.examples.patterns import pattern_model
from graphbisect.model import load_model
from graphbisect.model.diff import describe_type
from graphbisect.oracle.signature import EXACT_ROOTED, FailureKind
from graphbisect.oracle.tester import judge
from graphbisect.strategies.subgraph import SubgraphSpace
from graphbisect.workflows.reduce import ReduceOptions, reduce_model, resume_reduction
from tests.declaration_models import (
    BILSTM_CORE,
    RESHAPE_FUSION_CORE,
    WIDTH,
    bilstm_inputs,
    bilstm_tagger,
    declared_rank_layernorm,
    reshape_fusion_host,
    reshape_fusion_inputs,
)

#: The interpreter running the tests (activated venv or not): a bare `python` may be another one.
PY = shlex.quote(sys.executable)


def _x() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((WIDTH, WIDTH)).astype(np.float32)}


def _repro(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, timeout=180,
                          cwd=bundle.parent, check=False)


# --- class 1: declarations survive -------------------------------------------------------------------------


def test_normalized_model_keeps_the_users_declarations_and_knows_inferred_types() -> None:
    proto = declared_rank_layernorm()
    model = load_model(proto)
    assert [describe_type(v) for v in model.proto.graph.value_info] == ["FLOAT[n,8]"]  # nothing inferred added
    assert describe_type(model.proto.graph.output[0]) == "FLOAT[rank unknown]"
    assert model.tensor_type("c") is not None and model.tensor_type("c").rank == 2  # inferred, kept beside
    assert model.declared("c") is None and model.declared("h") is not None


def test_whole_node_set_materializes_to_the_original_declarations(tmp_path: Path) -> None:
    model = load_model(declared_rank_layernorm())
    space = SubgraphSpace(model, {**_x()}.__getitem__, tmp_path)
    whole = space.materialize(range(len(model.nodes))).proto
    for field in ("input", "output", "value_info"):
        assert [(v.name, describe_type(v)) for v in getattr(whole.graph, field)] == \
            [(v.name, describe_type(v)) for v in getattr(model.proto.graph, field)], field


def test_reduce_keeps_a_declaration_a_fusion_depends_on(tmp_path: Path) -> None:
    """The failure needs h's declared rank: the bundle fails on ONNX Runtime and declares no concrete shape
    that the user's model did not have (the cut point is [n, 8] as the original's inference knows it)."""
    plain = load_model(declared_rank_layernorm(value_info=False))
    assert not reduce_model(plain, tmp_path / "none", inputs=_x()).failed  # without the declaration: no bug
    result = reduce_model(load_model(declared_rank_layernorm()), tmp_path / "bug", inputs=_x())
    assert result.failed and result.verified and result.one_minimal and not result.flaky
    bundle = onnx.load(str(tmp_path / "bug" / "model.onnx"))
    declared = {v.name: describe_type(v) for v in (*bundle.graph.input, *bundle.graph.value_info)}
    assert all("n" in text.split("[")[1] for text in declared.values() if text != "FLOAT[rank unknown]"), declared
    assert "FLOAT[8,8]" not in declared.values()
    assert _repro(tmp_path / "bug").returncode == 1


def test_dynamic_dims_survive_into_candidates_openvino(tmp_path: Path) -> None:
    """OpenVINO refuses GlobalLpPool on a dynamic batch: candidates must keep the declared dynamic dims."""
    pytest.importorskip("openvino")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalLpPool", ["r"], ["p"], p=2, name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "m")]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           ["batch", 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], inits)
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    result = reduce_model(model, tmp_path / "bug", inputs=feeds, options=ReduceOptions(target="openvino"))
    # a conversion failure of OpenVINO's ONNX frontend: the target refuses the model (one classifier, issue 26)
    assert result.signature.kind is FailureKind.UNSUPPORTED
    assert result.kept_nodes == ("pool",) and result.verified and result.one_minimal
    first_dim = onnx.load(str(tmp_path / "bug" / "model.onnx")).graph.input[0].type.tensor_type.shape.dim[0]
    assert first_dim.dim_param and not first_dim.HasField("dim_value")
    assert _repro(tmp_path / "bug").returncode == 1


def test_a_failure_that_needs_dynamic_dims_reduces_iree(tmp_path: Path) -> None:
    """The whole model as a candidate is the original (no LSTM Y_h/Y_c outputs, which hide the miscompile),
    and the token ids cut between Transpose and Gather keep their dynamic [seq, batch] as a graph input instead
    of becoming a constant of the captured run's shape: the reduction ends at the Gather and the LSTM."""
    pytest.importorskip("iree.compiler")
    static = graphbisect.compare(bilstm_tagger(dynamic=False), target="iree", inputs=bilstm_inputs(), layerwise=False)
    assert static.passed  # with the dimensions fixed IREE computes it right
    result = reduce_model(load_model(bilstm_tagger()), tmp_path / "bug", inputs=bilstm_inputs(),
                          options=ReduceOptions(target="iree"))
    assert result.failed and result.signature.kind is FailureKind.MISMATCH
    assert result.kept_nodes == BILSTM_CORE and result.verified and result.one_minimal
    bundle = onnx.load(str(tmp_path / "bug" / "model.onnx"))
    assert [describe_type(v) for v in bundle.graph.input] == ["INT64[seq,batch]"]
    assert [v.name for v in bundle.graph.output] == ["Y"]
    assert _repro(tmp_path / "bug").returncode == 1


def test_a_float_error_rooted_in_integers_reduces_to_the_integer_bug(tmp_path: Path) -> None:
    """ONNX Runtime's ReshapeFusion swaps a Reshape's ids for a shape: a float error at ``y`` through a Cast.
    The first divergence is the integer ``bug_y``, so the candidate without the Cast (``bug_y`` promoted to an
    output, declared [2, 1] as the user did: the fusion needs it) fails the same way, and the CLI's bundle is
    the 3-node core (main: 4 nodes, the Cast kept: "no float output, and the failure is a float error")."""
    plain = graphbisect.compare(reshape_fusion_host(declared=False), inputs=reshape_fusion_inputs(), layerwise=False)
    assert plain.passed  # without the declaration the fusion does not fire
    model, inputs, bundle = tmp_path / "model.onnx", tmp_path / "inputs.npz", tmp_path / "bug"
    onnx.save(reshape_fusion_host(), str(model))
    np.savez(inputs, **reshape_fusion_inputs())
    assert main(["reduce", str(model), "--inputs", str(inputs), "-o", str(bundle)]) == 1
    report = json.loads((bundle / "report.json").read_text())
    assert tuple(node["name"] for node in report["kept_nodes"]) == RESHAPE_FUSION_CORE
    assert report["verified"]
    # The search fed /gate/Shape's output to its removal as a constant (the fusion then folds the shape and does
    # not fire); the checker feeds it as a graph input, and that 2-node model still fails as recorded: a smaller
    # failing model exists, so 1-minimal is withdrawn, saying which removal (issue 35: claims from the checker).
    assert not report["one_minimal"]
    assert any("still failing as recorded without: /gate/Shape" in note for note in report["notes"])
    assert report["signature"]["detail"] == EXACT_ROOTED
    reduced = onnx.load(str(bundle / "model.onnx"))
    assert [(v.name, describe_type(v)) for v in reduced.graph.output] == [("bug_y", "INT64[2,1]")]
    assert _repro(bundle).returncode == 1 and main(["verify", str(bundle)]) == 1


def test_a_search_without_progress_stops() -> None:
    """Every candidate passes (only the whole set fails): the search stops after the stall limit."""
    n = 60
    evaluator = Evaluator(lambda keep: Outcome.FAIL if len(keep) == n else Outcome.PASS, n,
                          budget=Budget(max_stall=20, stall_per_unit=0.5))
    result = probdd(evaluator, frozenset(range(n)))
    assert result.stop_reason is StopReason.NO_PROGRESS and not result.minimal
    assert evaluator.invocations <= 31  # max(20, 0.5 * 60) runs without a failure


# --- class 4: a check runs in the caller's directory and cannot-run is a usage error ------------------------

#: ONNX Runtime's default optimizations against none (a check run per candidate: without onnx.reference, whose
#: import of ml_dtypes took ~0.5 s of CPU per run).
_CHECK = """
import sys, numpy as np, onnxruntime as ort
feeds = dict(np.load(sys.argv[2]))
def run(level):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"]).run(None, feeds)
want, got = run(ort.GraphOptimizationLevel.ORT_DISABLE_ALL), run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
if any(not np.allclose(w, g, 1e-3, 1e-3) for w, g in zip(want, got)):
    sys.exit("outputs differ from the unoptimized run")
"""


def test_check_runs_in_the_callers_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "check.py").write_text(_CHECK)
    monkeypatch.chdir(tmp_path)
    model = load_model(pattern_model("layernorm_keepdims0"))
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    result = reduce_model(model, tmp_path / "bug", inputs=feeds,
                          options=ReduceOptions(check=f"{PY} check.py {{model}} {{inputs}}"))
    assert result.verified and result.final_nodes >= 6  # the LayerNorm core, not "whatever makes python exit 2"
    assert "the check's last stderr line: outputs differ from the unoptimized run" in result.notes
    report = (tmp_path / "bug" / "report.md").read_text()
    assert "outputs differ from the unoptimized run" in report


@pytest.mark.parametrize("check", [f"{PY} missing_check.py {{model}} {{inputs}}", "no-such-program {model}"])
def test_a_check_that_cannot_run_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  check: str) -> None:
    monkeypatch.chdir(tmp_path)
    model = load_model(pattern_model("layernorm_keepdims0"))
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    with pytest.raises(SpecError, match="cannot run") as raised:
        reduce_model(model, tmp_path / "bug", inputs=feeds, options=ReduceOptions(check=check))
    assert raised.value.hint and "relative" in raised.value.hint
    assert not (tmp_path / "bug" / "model.onnx").exists()


# --- issue 16 item 4: flaky targets are never certified ------------------------------------------------------

FLAKY = f"command:cmd={PY} {script_path()} {{model}} {{inputs}} {{outputs}}"


def _fails_every_time(bundle: Path, runs: int = 5) -> bool:
    """The ground truth: the bundle's model fails on fault-free ONNX Runtime in every run."""
    with np.load(bundle / "inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    with np.load(bundle / "oracle_outputs.npz") as data:
        expected = {k: data[k] for k in data.files}
    with BackendProcess("onnxruntime:opt_level=all", workdir=bundle.parent / "truth") as proc:
        return all(judge(proc.run(bundle / "model.onnx", feeds), expected.__getitem__, list(expected),
                         Tolerance()).signature.failed for _ in range(runs))


def _flaky_reduce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, seed: int,  # type: ignore[no-untyped-def]
                  rate: float = 0.3, *, host: bool = True):
    """Reduce the 100-node host of the LayerNorm mis-fusion (``host=False``: the 9-node pattern alone, whose
    baseline draws the same faults, for a test about the baseline) on the flaky target."""
    monkeypatch.setenv("FLAKY_MODE", mode)
    monkeypatch.setenv("FLAKY_RATE", str(rate))
    monkeypatch.setenv("FLAKY_SEED", str(seed))
    monkeypatch.setenv("FLAKY_COUNTER", str(tmp_path / "counter"))
    if host:
        network = host_network(100, bug="layernorm_keepdims0", position="main", seed=0)
        model, inputs = network.model, network.inputs
    else:
        model = pattern_model("layernorm_keepdims0")
        inputs = {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    return reduce_model(load_model(model), tmp_path / "bug", inputs=inputs,
                        options=ReduceOptions(oracle="onnxruntime:opt_level=disable", target=FLAKY))


def test_randomly_perturbed_results_are_never_certified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 0: three faults in a row land on the re-verification of a drifted 3-node result, which one
    fresh run used to certify. A certified result must fail every time on the fault-free target."""
    result = _flaky_reduce(tmp_path, monkeypatch, "perturb", seed=0)
    certified = result.verified and result.one_minimal
    assert not certified or _fails_every_time(tmp_path / "bug")
    if not certified:
        assert any("flaky" in note or "NOT re-verified" in note for note in result.notes)


def test_a_random_crash_at_baseline_is_outvoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 5: the first run of the original crashes at random, the next two show the real bug. (The baseline
    is the first runs whatever the model: the 9-node pattern decides it in ~30 target runs, the 100-node host
    in ~190.)"""
    result = _flaky_reduce(tmp_path, monkeypatch, "crash", seed=5, host=False)
    assert result.signature.kind is FailureKind.MISMATCH and result.flaky
    assert any("the completed runs' majority" in note and "3 runs" in note for note in result.notes)
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    assert report["flaky"] is True
    assert not (result.verified and result.one_minimal) or _fails_every_time(tmp_path / "bug")


@pytest.fixture(scope="module")
def flaky_once_at_verification(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The 9-node LayerNorm pattern, seed 9 at rate 0.25, reduced from the CLI (``reduce --target
    command:...``): the original's runs agree, the single-run search's result crashes once in its
    re-verification, so the search is repeated. Returns the folder (``bug``, ``bug.work``, the fault counter
    ``n``) and what the CLI printed; the tests below read it, and copy it to change it (one reduction of ~45
    target runs serves both; the 100-node host at seed 0, rate 0.15 showed the same case in ~95)."""
    folder = tmp_path_factory.mktemp("flaky-cli")
    onnx.save(pattern_model("layernorm_keepdims0"), folder / "host.onnx")
    np.savez(folder / "in.npz", x=np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(printed):
        for name, value in (("MODE", "crash"), ("RATE", "0.25"), ("SEED", "9"), ("COUNTER", str(folder / "n"))):
            env.setenv(f"FLAKY_{name}", value)
        code = main(["reduce", str(folder / "host.onnx"), "--inputs", str(folder / "in.npz"), "-o",
                     str(folder / "bug"), "--oracle", "onnxruntime:opt_level=disable", "--target", FLAKY])
    assert code == 1
    return folder, printed.getvalue()


def test_a_resumed_run_keeps_the_flakiness_its_re_verification_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flaky_once_at_verification: tuple[Path, str]) -> None:
    """``--resume`` (which the CLI offered for such a result) replayed the single-run search, whose fresh
    re-verification happened to agree, and reported the target not flaky and the result 1-minimal: what the
    run had measured was forgotten."""
    shutil.copytree(flaky_once_at_verification[0], tmp_path, dirs_exist_ok=True)
    first = json.loads((tmp_path / "bug" / "report.json").read_text())
    assert first["flaky"] and any("the search is repeated" in note for note in first["notes"])  # the case under test
    assert (tmp_path / "bug.work").is_dir()  # nothing certified: the work folder stays for --resume
    for name, value in (("MODE", "crash"), ("RATE", "0.25"), ("SEED", "9"), ("COUNTER", str(tmp_path / "n"))):
        monkeypatch.setenv(f"FLAKY_{name}", value)  # the faults go on from where the first session stopped
    resumed = resume_reduction(tmp_path / "bug")
    assert resumed.flaky, resumed.notes
    assert resumed.one_minimal == first["one_minimal"]
    assert any("flaky" in note for note in resumed.notes)
    assert json.loads((tmp_path / "bug" / "report.json").read_text())["flaky"] is True


def test_the_cli_gives_the_true_reason_a_verified_result_is_not_proven_minimal(
        flaky_once_at_verification: tuple[Path, str]) -> None:
    """The result is verified, and 1-minimality is withheld only because the target is flaky. It printed
    "NOT PROVEN (re-verification failed)" and offered a --resume that cannot change a finished search."""
    folder, out = flaky_once_at_verification
    report = json.loads((folder / "bug" / "report.json").read_text())
    assert report["verified"] and report["flaky"] and not report["one_minimal"]  # the case under test
    assert "1-minimal: NOT PROVEN (see the notes)" in out and "re-verification failed" not in out
    assert "--resume" not in out
    assert "note: 1-minimality is not claimed on a flaky target" in out


# --- the report's optimization levels are judged the way the reduction judged -----------------------------


def test_levels_of_a_fail_regex_reduction_are_judged_by_the_regex(tmp_path: Path) -> None:
    """ONNX Runtime's ReluClip fusion crashes on a float64 Clip at every level from ``basic`` up. Reduced with
    ``--fail-regex``, the report's levels table judged each level by the tolerance alone: every failing level
    read "crash-load (...)" instead of "fails the same way", and ``lowest_failing`` was null for a failure
    verified at the target's own level. The ground truth is the regex searched in real runs of the bundle."""
    regex = "Unexpected data type"
    result = reduce_model(load_model(pattern_model("relu_clip_f64")), tmp_path / "bug",
                          inputs={"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)},
                          options=ReduceOptions(fail_regex=regex))
    assert result.signature.kind is FailureKind.REGEX and result.verified
    levels = json.loads((tmp_path / "bug" / "report.json").read_text())["optimization_levels"]
    with np.load(tmp_path / "bug" / "inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    truth = None
    for level in ("disable", "basic", "extended", "all"):
        with BackendProcess(f"onnxruntime:opt_level={level}", workdir=tmp_path / level) as proc:
            run = proc.run(tmp_path / "bug" / "model.onnx", feeds)
        if re.search(regex, "\n".join(filter(None, (run.message, run.log, run.error_type)))):
            truth = level
            break
    assert truth is not None  # the reduced model still shows the failure at ORT's own level
    assert levels["lowest_failing"] == truth
    assert levels["levels"][truth] == "fails the same way"
    assert f"Lowest failing level: `opt_level={truth}`" in (tmp_path / "bug" / "report.md").read_text()
    # The target crashed (its message matched): it has no values, so the spec's word blames no side; it said
    # "`onnx.reference` agrees with the oracle and not with the target: by the specification the target is wrong".
    report = json.loads((tmp_path / "bug" / "report.json").read_text())
    assert report["spec_check"]["verdict"] == "no-target-outputs"
    assert report["spec_check"]["agrees_with_target"] is None and report["spec_check"]["agrees_with_oracle"]
    assert "the target is wrong" not in (tmp_path / "bug" / "report.md").read_text()
