"""`graphbisect passes` on real pass bugs: ONNX Runtime's LayerNorm fusions and FuseReluClip, Paddle's oneDNN passes.

Verified on onnxruntime 1.31.1: the keepdims=0 LayerNorm is mis-fused by LayerNormFusionL1 (basic level)
*and* by SimplifiedLayerNormFusion (extended level) on its tail, so at opt_level=all both must be disabled
and either one alone reproduces; FuseReluClip on float64 fails session creation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from graphbisect.backends.cost import describe_calls
from graphbisect.cli.main import main
from graphbisect.cli.passes_cmd import print_passes
from graphbisect.compare import Tolerance
from graphbisect.examples.hosts import host_inputs, host_network
from graphbisect.examples.patterns import pattern_model
from graphbisect.model import load_model
from graphbisect.workflows.passes import NOT_LISTED, PassesOptions, find_culprit_passes

LN = ("LayerNormFusionL1", "SimplifiedLayerNormFusion")




def _save_host(directory: Path, bug: str) -> tuple[Path, Path]:
    model, inputs = directory / f"{bug}.onnx", directory / f"{bug}.npz"
    onnx.save(host_network(150, bug=bug).model, model)
    np.savez(inputs, **host_inputs())
    return model, inputs


@pytest.fixture(scope="module")
def ln_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """`passes -o` on the LayerNorm host at opt_level=all: (exit code, --json data, bundle)."""
    tmp = tmp_path_factory.mktemp("ln_all")
    model, inputs = _save_host(tmp, "layernorm_keepdims0")
    code = main(["passes", str(model), "--inputs", str(inputs), "--target", "onnxruntime:opt_level=all",
                 "--json", str(tmp / "r.json"), "-o", str(tmp / "bundle")])
    return code, json.loads((tmp / "r.json").read_text()), tmp / "bundle"


def test_layernorm_culprits_at_all_are_both_fusions(ln_all: tuple[int, dict[str, Any], Path]) -> None:
    code, data, _ = ln_all
    assert code == 1 and data["failed"]
    assert set(LN) <= set(data["searched"])  # on the region SimplifiedLayerNormFusion fires once L1 is disabled
    scope = data["scope"]  # searched on the 9 nodes ORT fused, confirmed on the whole model
    assert scope["searched_on"] == "region" and len(scope["region_nodes"]) == 9
    assert scope["confirmed"] and scope["required_reproduces"] and scope["whole_model_target_runs"] == 4
    assert set(data["culprits"]) == set(LN)  # each alone mis-fuses: disabling one leaves a failure
    # The failure's identity is the LayerNormalization that LayerNormFusionL1 made: enabled alone,
    # SimplifiedLayerNormFusion mis-fuses the same nodes into another node, another failure (by kind the same)
    assert data["required"] == ["LayerNormFusionL1"]
    assert data["each_alone"] == ["LayerNormFusionL1"] and data["minimal"]
    assert data["invocations"]["oracle"] == 1
    assert data["search"]["disable"]["invocations"] + data["search"]["enable"]["invocations"] <= 24


def test_passes_bundle_repro_reproduces_and_control_passes(ln_all: tuple[int, dict[str, Any], Path]) -> None:
    _, data, bundle = ln_all
    assert data["reduce"]["failed"] and data["reduce"]["final_nodes"] <= 9
    config = json.loads((bundle / "repro_config.json").read_text())
    assert set(LN) <= set(config["control"]["options"]["disabled_optimizers"])
    proc = subprocess.run([sys.executable, str(bundle / "repro.py")], check=False, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout and "CONTROL PASSES" in proc.stdout
    facts = json.loads((bundle / "report.json").read_text())["passes"]
    assert facts["control_passes"]
    fused = {line.split()[0] for line in facts["optimized_nodes"]}
    assert fused & {"LayerNormalization", "SimplifiedLayerNormalization"}
    report_md = (bundle / "report.md").read_text()
    assert "## Optimization passes" in report_md
    # the summary names every run the bundle cost, not only the reduction's, and what each compiled
    searched = json.loads((bundle / "report.json").read_text())["passes"]
    row = next(line for line in report_md.splitlines() if line.startswith("| Backend invocations |"))
    cost = describe_calls(searched["invocations"], searched["backend_calls"])
    assert row.startswith(f"| Backend invocations | {cost} for the pass search; ")
    # the checker's plain runs (the Audit section) last
    assert re.search(r"control 1 \(1 compile\)(, audit \w+ \d+ \(\d+ compiles?\))+ for measuring the sections below "
                     r"\|$", row), row


def test_reduce_with_passes_at_basic_names_only_layernormfusion(tmp_path: Path) -> None:
    model, inputs = _save_host(tmp_path, "layernorm_keepdims0")
    code = main(["reduce", str(model), "--inputs", str(inputs), "--target", "onnxruntime:opt_level=basic",
                 "--passes", "-o", str(tmp_path / "bundle"), "--json", str(tmp_path / "r.json")])
    assert code == 1
    facts = json.loads((tmp_path / "bundle" / "report.json").read_text())["passes"]
    assert "SimplifiedLayerNormFusion" not in facts["fired"]  # an extended-level pass
    assert facts["culprits"] == ["LayerNormFusionL1"] and facts["required"] == ["LayerNormFusionL1"]
    assert json.loads((tmp_path / "r.json").read_text())["final_nodes"] == 9  # the whole pattern at basic


def _counting_python(folder: Path) -> tuple[Path, Path]:
    """An interpreter for ``python=`` that is this one, with every ``InferenceSession.run`` of its workers
    appended to a log: (the interpreter, the log). The runs are real; only their number is recorded."""
    site, log = folder / "site", folder / "runs.log"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nimport onnxruntime\n_run = onnxruntime.InferenceSession.run\n\n\n"
        "def run(self, *args, **kwargs):\n"
        "    with open(os.environ['GB_RUNS_LOG'], 'a') as log:\n        log.write('run\\n')\n"
        "    return _run(self, *args, **kwargs)\n\n\nonnxruntime.InferenceSession.run = run\n")
    python = folder / "python"
    python.write_text(f"#!/bin/sh\nGB_RUNS_LOG='{log}' PYTHONPATH='{site}'${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec '{sys.executable}' \"$@\"\n")
    python.chmod(0o755)
    return python, log


def test_a_passes_bundle_counts_every_target_run(tmp_path: Path) -> None:
    """``reduce(passes=True)``: the pass search and the checker's plain runs of its answer, the reduction, the
    report's facts and the control run (culprit passes disabled) plus the compiled view of the reduced model, and
    the checker's audit, all run the target. The bundle counted all but the control and the compiled view
    (``report_runs`` left them out)."""
    import graphbisect

    python, log = _counting_python(tmp_path)
    model = tmp_path / "ln.onnx"
    onnx.save(host_network(100, bug="layernorm_keepdims0").model, model)
    result = graphbisect.reduce(model, tmp_path / "bundle", oracle="reference",
                                target=f"onnxruntime:opt_level=all,python={python}", passes=True)
    assert result.failed and result.verified
    report = json.loads((tmp_path / "bundle" / "report.json").read_text())
    counted = (report["passes"]["invocations"]["target"] + report["passes"]["invocations"]["audit target"]
               + report["invocations"]["target"]
               + sum(n for role, n in report["report_runs"].items() if role in ("target", "control", "audit target")))
    assert counted == len(log.read_text().splitlines())
    assert report["report_runs"]["control"] == 1
    # the same runs with what they compiled: one session each (the control, the compiled view, the facts' runs)
    assert {role: calls["runs"] for role, calls in report["report_calls"].items()} == report["report_runs"]
    assert all(calls["compiles"] >= calls["runs"] for calls in report["report_calls"].values())


def test_fuse_relu_clip_crash_is_named(tmp_path: Path) -> None:
    model = load_model(host_network(150, bug="relu_clip_f64").model)
    result = find_culprit_passes(model, inputs=host_inputs(), workdir=tmp_path,
                                 options=PassesOptions(target="onnxruntime:opt_level=all"))
    assert result.signature.kind.value == "crash-load"
    assert result.source == "catalogue"  # session creation failed before ORT could report what fired
    assert result.culprits == ("FuseReluClip",) and result.required == ("FuseReluClip",)
    assert result.invocations["target"] <= 30 and result.minimal


@pytest.mark.parametrize("region", [True, False])
def test_a_target_that_does_not_fail_never_claims_no_pass_fired(
        tmp_path: Path, region: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """ONNX Runtime fuses the healthy float32 Relu → Clip with FuseReluClip, correctly: nothing to search. The
    result used to say no pass fired ("fired passes (0, reported)"), which the target never reported."""
    model = load_model(pattern_model("relu_clip_f32"))
    result = find_culprit_passes(model, inputs={"x": np.linspace(-8, 8, 64, dtype=np.float32).reshape(8, 8)},
                                 workdir=tmp_path, options=PassesOptions(region=region))
    assert not result.failed
    print_passes(result)
    printed = capsys.readouterr().out
    if region:  # the whole-model run saved the compiled graph and was not asked which passes fired
        assert result.source == NOT_LISTED and result.fired == ()
        assert "fired passes: not listed" in printed
    else:  # the run was asked: the result says what the target reported
        assert result.source == "reported" and "FuseReluClip" in result.fired
        assert "fired passes (1, reported): FuseReluClip" in printed


@pytest.mark.paddle
@pytest.mark.slow
def test_paddle_pass_ablation_is_honest_about_non_monotone_rounding(tmp_path: Path) -> None:
    """MobileNetV2, Paddle Inference vs ORT on its conversion. Measured on one CPU (Paddle 3.3.1): 3.6e-5 apart
    by default, 2.2e-5 without depthwise_conv_onednn_pass, 3.9e-5 with every disable-able fired pass deleted:
    deleting one real pass changes the outputs, but rounding moves both ways, so at a tolerance between
    those no set of passes explains the mismatch "monotonically": the search confirms the ends first and
    says so, instead of naming a pass. The bookkeeping passes are never deleted, so that end runs at all.

    The errors depend on the CPU's kernels (oneDNN picks AMX/avx512_bf16 paths where it finds them), so the
    tolerance and the expected verdict follow what this CPU measures: the tolerance sits between the
    default error and the one-pass-deleted error, and the search's verdict must agree with the measured
    error of its all-deleted end (non-monotone: no set explains it; monotone: a culprit whose deletion passes)."""
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import mobilenet_v2_errors

    prefix, feeds, error = mobilenet_v2_errors(tmp_path)
    default, one_deleted = error("paddle"), error("paddle:delete_pass=depthwise_conv_onednn_pass")
    assert abs(default - one_deleted) > 1e-6  # deleting one real pass changes the outputs
    if not one_deleted < default:
        pytest.skip(f"on this CPU deleting depthwise_conv_onednn_pass does not lower the error ({default:.3g} → "
                    f"{one_deleted:.3g}): no tolerance separates them")
    atol = float(np.sqrt(default * one_deleted))
    options = PassesOptions(target="paddle", oracle="onnxruntime:opt_level=disable",
                            tolerance=Tolerance(atol=atol, rtol=0.0))
    result = find_culprit_passes(load_model(prefix), inputs=feeds, options=options, workdir=tmp_path / "work")
    assert result.failed and "depthwise_conv_onednn_pass" in result.searched
    assert "dead_code_elimination_pass" in result.excluded  # bookkeeping: deleting it breaks the predictor
    all_deleted = error(f"paddle:delete_pass={';'.join(result.searched)}")
    if all_deleted > atol:  # the far end fails too: no set of passes explains the mismatch
        assert result.culprits == () and any("no set of passes explains" in note for note in result.notes)
    else:
        assert result.culprits and result.fixed_target
        assert error(result.fixed_target) <= atol  # the named workaround measured to pass


@pytest.mark.paddle
def test_paddle_fired_passes_are_listed_when_glog_is_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paddle users often set GLOG_minloglevel=2 to silence Paddle. Its "detected [N] subgraphs" lines are
    glog INFO, and glog reads the level when Paddle is imported: the worker imports Paddle (for its version,
    then to validate the options) before loading the model, so the runtime must lift the level when it is
    created. Before the fix, `passes` printed "fired passes (0, reported)" for a conv/bn net on which Paddle
    3.3.1 fires conv2d_bias_bn_onednn_fuse_pass and ten others."""
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import CONV_NET_INPUT, export_conv_net

    monkeypatch.setenv("GLOG_minloglevel", "2")  # inherited by the worker
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path / "cache"))
    prefix = export_conv_net(tmp_path / "conv")
    name, shape = CONV_NET_INPUT
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    options = PassesOptions(target="paddle", oracle="onnxruntime:opt_level=disable")
    result = find_culprit_passes(load_model(prefix), inputs=feeds, options=options, workdir=tmp_path / "work")
    assert not result.failed and result.source == "reported"
    assert {"conv2d_bias_bn_onednn_fuse_pass", "conv_activation_onednn_fuse_pass"} <= set(result.fired)


def test_a_fired_list_the_backend_could_not_know_is_not_reported_as_empty() -> None:
    """Paddle says ``fired_passes_known: false`` when it ran passes but printed none of their match lines (glog
    INFO hidden): its empty list means "unknown", and `passes` must not print "fired passes (0, reported)"."""
    from graphbisect.backends.base import RunResult, RunStatus
    from graphbisect.workflows.passes import _reported

    unknown = RunResult(RunStatus.OK, info={"fired_passes": [], "fired_passes_known": False, "passes_run": ["a"]})
    assert _reported(unknown) is None
    assert _reported(RunResult(RunStatus.OK, info={"fired_passes": ["p"], "fired_passes_known": True})) == ["p"]
    assert _reported(RunResult(RunStatus.OK, info={"fired_passes": []})) == []  # ORT: known, and none fired
    assert _reported(RunResult(RunStatus.OK)) is None
