"""Every backend call is counted by kind: runs, and the compiles behind them (graphbisect/backends/cost.py).

On real backends: ONNX Runtime builds one session for two runs of one model, and counts the sessions it builds
only to find which rewrite rules fired, but not those that list the optimizer names it has (once per build);
IREE's ``report_passes=1`` compiles once per feature more inside one run, and a command's compile cache serves
a repeat compile of the same model and options.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.backends import Phase, resolve
from graphbisect.backends.cost import Cost
from graphbisect.backends.iree import FEATURES
from graphbisect.backends.process import BackendProcess, compile_cache
from graphbisect.examples.iree_bugs import iree_bug_model

iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


def _model(tmp_path: Path, bug: str = "gridsample", blocks: int = 3) -> tuple[Path, dict]:
    model, inputs, _ = iree_bug_model(bug, blocks=blocks)
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx", inputs


def _relu(tmp_path: Path) -> tuple[Path, dict]:
    """A one-node model (Relu on x: float32[1, 8]) and its inputs."""
    x, y = (onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 8]) for name in ("x", "y"))
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    return tmp_path / "relu.onnx", {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)}


def test_a_session_reused_by_the_next_run_is_one_compile_for_two_runs(tmp_path: Path) -> None:
    path, inputs = _model(tmp_path)
    with BackendProcess("onnxruntime", workdir=tmp_path / "w") as proc:
        first, second = proc.run(path, inputs), proc.run(path, inputs)
        assert (first.compiles, second.compiles) == (1, 0)
        assert proc.cost == Cost(runs=2, compiles=1)


@iree_installed
def test_iree_feature_listing_counts_every_compile_and_the_cache_serves_repeats(tmp_path: Path) -> None:
    path, inputs = _relu(tmp_path)  # 20 compiles: a one-node model compiles in half the time of the smallest host
    with compile_cache(tmp_path / "cache"):
        with BackendProcess("iree:report_passes=1", workdir=tmp_path / "listing") as proc:
            listing = proc.run(path, inputs)
        # the model, twice more for the compiler's noise, and once per feature: one run, 17 compiles
        assert listing.ok and listing.compiles == 1 + 2 + len(FEATURES)
        with BackendProcess("iree:disabled=const-eval", workdir=tmp_path / "candidate") as proc:
            candidate = proc.run(path, inputs)  # the listing compiled this very module
        assert candidate.ok and (candidate.compiles, candidate.compile_cache_hits) == (0, 1)
    with BackendProcess("iree:disabled=const-eval", workdir=tmp_path / "uncached") as proc:
        assert proc.run(path, inputs).compiles == 1  # no cache outside the block: compiled again
    with compile_cache(tmp_path / "cache"), BackendProcess("iree:cpu=generic", workdir=tmp_path / "cpu") as proc:
        assert proc.run(path, inputs).compiles == 1  # another target CPU is another key


def test_ort_sessions_made_to_find_the_fired_rules_count_as_compiles(models: dict[str, Path], tmp_path: Path) -> None:
    # FuseReluClip is a rewrite rule: ORT logs only its rule set, so the runtime builds sessions with subsets of
    # the set's rules enabled until one rule is left; each is a compile (one was counted: the run's session)
    x = np.ones((2, 3), np.float32)
    with BackendProcess("onnxruntime:opt_level=basic,report_passes=1", workdir=tmp_path / "w") as proc:
        first, again = proc.run(models["relu_clip32"], {"x": x}), proc.run(models["relu_clip32"], {"x": x})
        assert first.ok and first.info["fired_passes"] == ["FuseReluClip"]
        assert first.compiles >= 1 + 2  # the run's session, then at least one subset of each half
        assert again.compiles == 0  # the session is reused: nothing is built, nothing searched
        assert proc.cost == Cost(runs=2, compiles=first.compiles)
    with BackendProcess("onnxruntime:opt_level=basic", workdir=tmp_path / "plain") as proc:
        assert proc.run(models["relu_clip32"], {"x": x}).compiles == 1  # without the listing: one session


@pytest.fixture(scope="module")
def ort_catalogue(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Cost, Path]:
    """ONNX Runtime's optimizer names as a worker lists them in a fresh cache folder (~400 probe sessions, ~5 s of
    CPU; two tests read it): the names, the worker's counted cost, and the cache folder."""
    folder = tmp_path_factory.mktemp("ort-catalogue")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRAPHBISECT_CACHE", str(folder / "cache"))
        with BackendProcess("onnxruntime", workdir=folder / "listing") as proc:
            return proc.registered_passes() or [], proc.cost, folder / "cache"


def test_ort_sessions_that_list_the_optimizer_names_are_not_the_targets_compiles(
        models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        ort_catalogue: tuple[list[str], Cost, Path]) -> None:
    # A new ORT build's optimizer names are found by building ~400 sessions of a one-node probe model (then
    # cached on disk): the `passes` listing, the validation of disabled= names, report_passes=1. They are not
    # the target's work on the model: the first bundle on a fresh machine said "target 4 (414 compiles)" for four
    # runs of a 9-node model (issue 35). Counted apart (probe_sessions), never as the target's compiles.
    names, cost, cache = ort_catalogue
    assert names and "FuseReluClip" in names
    assert cost == Cost()  # every name was found by probe sessions: no model was compiled
    assert any(cache.rglob("*.json"))  # the listing did happen, in that worker
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path / "other-cache"))
    x = np.ones((2, 3), np.float32)
    with BackendProcess("onnxruntime:disabled=FuseReluClip", workdir=tmp_path / "validated") as proc:
        run = proc.run(models["relu_clip32"], {"x": x})
        assert run.ok and run.compiles == 1  # the names were listed before the first run: not its compiles
        assert proc.cost == Cost(runs=1, compiles=1)
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path / "third-cache"))
    with BackendProcess("onnxruntime:opt_level=basic,report_passes=1", workdir=tmp_path / "fired") as proc:
        fired = proc.run(models["relu_clip32"], {"x": x})
    with BackendProcess("onnxruntime:opt_level=basic,report_passes=1", workdir=tmp_path / "fired-again") as proc:
        again = proc.run(models["relu_clip32"], {"x": x})  # the catalogue is on disk now
    assert fired.ok and fired.info["fired_passes"] == ["FuseReluClip"] and fired.compiles == again.compiles


def _relu_clip_crash(tmp_path: Path) -> tuple[Path, dict]:
    """A real ONNX Runtime failure at session creation: its ReluClip fusion rejects a float64 Clip."""
    from graphbisect.examples.hosts import host_network

    host = host_network(100, bug="relu_clip_f64")
    onnx.save(host.model, tmp_path / "crash.onnx")
    return tmp_path / "crash.onnx", host.inputs


def test_compile_alone_reports_the_crash_a_run_reports_as_a_compile_and_no_run(tmp_path: Path) -> None:
    """``BackendProcess.compile`` builds without running: the failure at session creation is the run's own
    (same phase, type and message), counted as one compile and no invocation (issue 27)."""
    path, inputs = _relu_clip_crash(tmp_path)
    with BackendProcess("onnxruntime:opt_level=all", workdir=tmp_path / "w") as proc:
        built = proc.compile(path)
        assert proc.cost == Cost(runs=0, compiles=1)
        ran = proc.run(path, inputs)
    assert not built.ok and built.phase is Phase.LOAD and built.compiles == 1 and not built.outputs
    assert (built.status, built.phase, built.error_type, built.message) == (ran.status, ran.phase, ran.error_type,
                                                                            ran.message)
    assert "Unexpected data type for Clip" in (built.message or "")


def test_a_run_after_a_compile_alone_uses_its_build(tmp_path: Path) -> None:
    path, inputs = _model(tmp_path)
    with BackendProcess("onnxruntime", workdir=tmp_path / "w") as proc:
        built = proc.compile(path)
        ran = proc.run(path, inputs)
        assert proc.cost == Cost(runs=1, compiles=1)
    assert built.ok and not built.outputs and built.compiles == 1
    assert ran.ok and ran.compiles == 0 and ran.info["session_reused"]


@iree_installed
def test_iree_compile_alone_gives_the_compilers_diagnostic(tmp_path: Path) -> None:
    path, inputs = _model(tmp_path, "maxunpool")
    with BackendProcess("iree", workdir=tmp_path / "w") as proc:
        built, ran = proc.compile(path), proc.run(path, inputs)
        assert proc.cost == Cost(runs=1, compiles=2)
    assert built.phase is Phase.LOAD and built.error_type == ran.error_type == "IreeCompileError"
    assert built.message == ran.message and "torch.aten.max_unpool2d" in (built.message or "")


def test_a_few_optimizer_names_are_checked_without_listing_them_all(
        models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        ort_catalogue: tuple[list[str], Cost, Path]) -> None:
    # The whole catalogue is ~400 probe sessions and ~5 s on a fresh machine (its rewrite rules found by group
    # testing over ORT's binary): the first `reduce --example` listed it only to name the pass that made one
    # fused node, to validate a spec's disabled= and to say which transformers fired. A few names are asked of
    # ORT directly now; the catalogue is listed only where every name is needed.
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(cache))
    x = np.ones((2, 3), np.float32)
    with BackendProcess("onnxruntime:disabled=FuseReluClip;LayerNormFusionL1", workdir=tmp_path / "v") as proc:
        run = proc.run(models["relu_clip32"], {"x": x})  # a rule and a transformer: both valid
        assert run.ok and run.compiles == 1  # the names' probe sessions are not the model's compiles
        among = proc.registered_passes(among=["LayerNormFusion", "LayerNormFusionL1", "LayerNormFusionL2",
                                              "FuseReluClip", "NoSuchFusion"])
        assert among == ["LayerNormFusionL1", "LayerNormFusionL2", "FuseReluClip"]
    with BackendProcess("onnxruntime:report_passes=1", workdir=tmp_path / "fired") as proc:
        fired = proc.run(models["conv_relu"], {"x": np.ones((1, 3, 8, 8), np.float32)})
    assert fired.ok and "ConvActivationFusion" in fired.info["fired_passes"]  # transformers, no rule set
    assert not any("RuleBased" in name for name in fired.info["fired_passes"] + fired.info["fired_required"])
    assert not any(cache.rglob("*.json"))  # the catalogue was never listed
    assert set(among) <= set(ort_catalogue[0])  # the same names the catalogue has
