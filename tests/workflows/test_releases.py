"""`graphbisect releases` on real ONNX Runtime releases, each in its cached environment (tests/ort_releases.py's
folder, shared: 1.17.3, 1.20.1 and 1.22.1 from there, 1.21.0, 1.21.1 and 1.22.0 made here once; the newest is
the release installed in this interpreter). Skipped where an environment cannot be made (no package index).

Measured per release on CPU, Python 3.11 (docs/guide/releases.md):
* the keepdims=0 LayerNorm mis-fusion (onnxruntime#30513) fails in every release from 1.17.3 to 1.32.0; 1.17.3 names
  its fused node ``LayerNormalization`` where 1.20 names it ``<node>/LayerNormFusion/``, and is matched across
  releases by the kind and the exact region it covers; with LayerNormFusion disabled, 1.17.3's
  SimplifiedLayerNormFusion mis-fuses the core of the same pattern: another failure, a skip;
* FuseReluClip's float64 crash is raised as ``RuntimeException`` (status 6) up to 1.22.1 and as ``Fail`` (status 1)
  by 1.32.0: the same message, the same failure;
* a model stamped opset 22 does not load before 1.21.0 ("Current official support for domain ai.onnx is till
  opset 21"): ONNX Runtime 1.21 is the release that added ONNX 1.17 (opset 22), as its compatibility table says;
* onnxruntime 1.14.1 has no wheel for Python 3.11 (the oldest on the index is 1.15.0).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import graphbisect as gb
from graphbisect.artifacts.bundle import load_bundle
from graphbisect.artifacts.releases_section import add_releases_section
from graphbisect.backends import BackendSpec
from graphbisect.cli.main import main
from graphbisect.errors import InputError
from graphbisect.examples.patterns import pattern_model
from graphbisect.releases.environments import prepare_environments
from graphbisect.releases.index import index_versions
from graphbisect.releases.search import FOUND, Change
from graphbisect.workflows.releases import search_releases
from graphbisect.workflows.releases_change import release_change
from tests.ort_releases import _root

HOST = metadata.version("onnxruntime")
#: Made here when missing (the other releases come from tests/ort_releases.py).
MORE = ("1.21.0", "1.21.1", "1.22.0")
#: No wheel for this Python on the index.
NO_WHEEL = "1.14.1"


@pytest.fixture(scope="module")
def cache(ort_release_pythons: dict[str, Path]) -> Path:
    """The shared release environments, with :data:`MORE` made (skipped where they cannot be)."""
    try:
        envs = prepare_environments("onnxruntime", list(MORE), cache=_root(), use_host=False)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make the release environments: {exc}")
    missing = [f"{v}: {env.error}" for v, env in envs.items() if env.error]
    if missing:
        pytest.skip(f"cannot make the release environments: {missing}")
    return _root()


def _at_opset_22(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.helper.make_model(model.graph, opset_imports=[onnx.helper.make_opsetid("", 22)], ir_version=10)


@pytest.fixture(scope="module")
def layernorm_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """onnxruntime#30513 reduced on this interpreter's release (a wrong result, matched by its identity)."""
    out = tmp_path_factory.mktemp("releases") / "layernorm"
    gb.reduce(pattern_model("layernorm_keepdims0"), out, target="onnxruntime:opt_level=all")
    return out


@pytest.fixture(scope="module")
def opset22_bundle(tmp_path_factory: pytest.TempPathFactory, ort_release_pythons: dict[str, Path]) -> Path:
    """A healthy model stamped opset 22, reduced on 1.20.1, which refuses to load it."""
    out = tmp_path_factory.mktemp("releases") / "opset22"
    gb.reduce(_at_opset_22(pattern_model("relu_clip_f32")), out,
              target=f"onnxruntime:opt_level=all,python={ort_release_pythons['1.20.1']}")
    return out


def test_a_failure_in_every_release_is_said_not_bisected_and_a_release_without_a_wheel_is_a_skip(
        layernorm_bundle: Path, cache: Path) -> None:
    versions = [NO_WHEEL, "1.17.3", "1.20.1", "1.22.1", HOST]
    with load_bundle(layernorm_bundle) as bundle:
        found = search_releases(bundle, "onnxruntime", versions=versions, cache=cache)
    assert found.status == "present-in-oldest" and not found.found
    assert found.first_bad is None and found.last_good is None
    assert found.tested[NO_WHEEL].verdict == "skip"
    assert "cannot install" in (found.tested[NO_WHEEL].reason or "")
    assert any(words in (found.tested[NO_WHEEL].reason or "")  # pip's words, or uv's
               for words in ("No matching distribution", "has no wheels with a matching Python ABI tag"))
    # 1.17.3 fuses it too and names no pass in its fused node ('LayerNormalization', where the bundle's release
    # names '/norm/Mul/LayerNormFusion/'): the same kind covering exactly the recorded region, the same failure
    old = found.tested["1.17.3"]
    assert old.verdict == "bad", old.reason
    assert "names no pass" in (old.reason or "") and "exactly the recorded 9 nodes" in (old.reason or "")
    # both ends checked (the oldest that runs stands in), nothing between them run
    assert set(found.tested) == {NO_WHEEL, "1.17.3", HOST}
    assert found.tested[HOST].verdict == "bad" and found.tested[HOST].reason is None  # the bundle's own names
    assert old.runs == 3 and not old.flaky  # the answer rests on it: voted
    assert old.magnitude is not None and old.magnitude > 1
    assert found.releases_run == 2 and found.installs == 0
    assert "from the oldest testable, 1.17.3" in found.paragraph
    assert "present in every release tested" in found.paragraph


def test_a_sibling_fusion_on_a_release_that_names_no_pass_is_still_another_failure(layernorm_bundle: Path,
                                                                                   cache: Path) -> None:
    """With LayerNormFusion disabled, 1.17.3 mis-fuses the 6-node core of the same pattern by
    SimplifiedLayerNormFusion, names that node without its pass too, and fails at the same output: the rule that
    lets an unnamed node stand for the recorded pass still wants the recorded kind over exactly the recorded
    region, so it is a skip. 1.20.1 registers the pass as LayerNormFusionL1 and refuses the name: a skip that
    cannot run."""
    with load_bundle(layernorm_bundle) as bundle:
        found = search_releases(bundle, "onnxruntime", versions=["1.17.3", "1.20.1"], cache=cache, repeat=1,
                                target="onnxruntime:opt_level=all,disabled=LayerNormFusion")
    assert found.status == "untestable" and not found.found
    old = found.tested["1.17.3"]
    assert old.verdict == "skip" and (old.reason or "").startswith("fails differently"), old.reason
    assert "SimplifiedLayerNormalization" in (old.reason or "")
    assert "not LayerNormalization made by LayerNormFusion" in (old.reason or "")
    assert "exactly the 9 region nodes" in (old.reason or "")
    assert found.tested["1.20.1"].verdict == "skip"
    assert "no optimizer named 'LayerNormFusion'" in (found.tested["1.20.1"].reason or "")


def test_the_release_that_fixed_it_is_found_and_a_second_run_installs_nothing(opset22_bundle: Path,
                                                                              cache: Path, tmp_path: Path) -> None:
    """1.17.3 refuses the model too, with the same error type and status, for another reason (its IR version):
    a crash of another message is another failure on another release, a skip."""
    versions = ["1.17.3", "1.20.1", *MORE, "1.22.1"]
    out = tmp_path / "fixed.json"
    code = main(["releases", str(opset22_bundle), "--package", "onnxruntime", "--versions", ",".join(versions),
                 "--find", "fixed", "--cache", str(cache), "--json", str(out)])
    assert code == 0
    found = json.loads(out.read_text())
    assert (found["last_bad"], found["first_fixed"]) == ("1.20.1", "1.21.0")
    assert found["first_bad"] is None and found["installs"] == 0
    assert found["tested"]["1.20.1"]["verdict"] == "bad" and found["tested"]["1.21.0"]["verdict"] == "good"
    old = found["tested"]["1.17.3"]
    assert old["verdict"] == "skip" and old["reason"].startswith("fails differently"), old
    assert "IR version" in old["reason"]
    assert found["releases_run"] <= found["bound"] + 1 and found["bound"] == 5  # one skip costs one more
    assert "is fixed in onnxruntime 1.21.0" in found["paragraph"]
    # what changed between them: the last bad release cannot build the model, so no passes to compare (said)
    assert found["changed"]["older"]["version"] == "1.20.1" and found["changed"]["older"]["fired"] is None
    assert found["changed"]["newer"]["fired"] is not None  # 1.21.0 built it and said what fired
    assert "1.20.1 cannot build the model, so it has no passes to compare" in found["paragraph"]
    # the bundle says so itself: a Releases section at the end of report.md, and report.json's releases.fixed
    report_md = (opset22_bundle / "report.md").read_text()
    assert report_md.rstrip().endswith("<!-- /graphbisect releases find=fixed -->")
    assert "| 1.21.0 | good | 3 | passes |" in report_md and "**last bad 1.20.1, first fixed 1.21.0**" in report_md
    assert "> " + found["paragraph"] in report_md
    recorded = json.loads((opset22_bundle / "report.json").read_text())
    assert recorded["releases"]["fixed"]["first_fixed"] == "1.21.0"
    # looked at the other way, the failure is gone in the newest release: said, not bisected (exit 1)
    assert main(["releases", str(opset22_bundle), "--package", "onnxruntime", "--versions", ",".join(versions),
                 "--cache", str(cache), "--json", str(out)]) == 1
    other = json.loads(out.read_text())
    assert other["status"] == "absent-in-newest" and other["first_bad"] is None
    assert list(other["tested"]) == ["1.22.1"]
    # a second section beside the first; the rest of both files as reduce wrote them, and the bundle still whole
    both = (opset22_bundle / "report.md").read_text()
    assert both.startswith(report_md[:report_md.index("<!-- graphbisect releases find=fixed -->")])
    assert both.count("<!-- graphbisect releases find=") == 2 and "**Not found (absent-in-newest)**" in both
    again = json.loads((opset22_bundle / "report.json").read_text())
    assert set(again["releases"]) == {"fixed", "bad"}
    assert {k: v for k, v in again.items() if k not in ("releases", "files")} == \
        {k: v for k, v in recorded.items() if k not in ("releases", "files")}
    with load_bundle(opset22_bundle) as reread:  # report.md's recorded sha256 follows it
        assert reread.report["releases"]["bad"]["status"] == "absent-in-newest"
    # the same search again replaces its own section
    add_releases_section(opset22_bundle, other)
    assert (opset22_bundle / "report.md").read_text() == both


def test_a_zipped_bundle_is_left_as_it_is_and_the_section_written_beside_it(opset22_bundle: Path, cache: Path,
                                                                            tmp_path: Path) -> None:
    archive = tmp_path / "opset22.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(opset22_bundle.iterdir()):
            zf.write(path, f"opset22/{path.name}")
    before = archive.read_bytes()
    assert main(["releases", str(archive), "--package", "onnxruntime", "--versions", "1.20.1,1.21.0",
                 "--find", "fixed", "--repeat", "1", "--cache", str(cache)]) == 0
    assert archive.read_bytes() == before
    beside = json.loads((tmp_path / "opset22.releases.json").read_text())
    assert beside["bundle"] == "opset22.zip" and beside["sha256"] == hashlib.sha256(before).hexdigest()
    assert beside["releases"]["fixed"]["first_fixed"] == "1.21.0"
    assert "**last bad 1.20.1, first fixed 1.21.0**" in (tmp_path / "opset22.releases.md").read_text()


def test_a_release_failing_another_way_is_a_skip_and_a_renamed_error_type_is_not(
        cache: Path, ort_release_pythons: dict[str, Path], tmp_path: Path) -> None:
    """FuseReluClip's float64 Clip crash in a model stamped opset 22, recorded on 1.22.1: 1.17.3 and 1.20.1 cannot
    load the model (another failure: skips, stepped around), and the newest release raises the same crash as
    another error type (``Fail``, status 1, where 1.22.1 raised ``RuntimeException``, status 6): the same
    message without them, so bad. The oldest release that fails the same way, 1.21.0, is named."""
    bundle_path = tmp_path / "clip22"
    gb.reduce(_at_opset_22(pattern_model("relu_clip_f64")), bundle_path,
              target=f"onnxruntime:opt_level=all,python={ort_release_pythons['1.22.1']}")
    with load_bundle(bundle_path) as bundle:
        found = search_releases(bundle, "onnxruntime", versions=["1.17.3", "1.20.1", "1.21.0", "1.22.1", HOST],
                                cache=cache, repeat=1)
    assert found.status == "present-in-oldest"
    for version in ("1.17.3", "1.20.1"):
        assert found.tested[version].verdict == "skip"
        assert (found.tested[version].reason or "").startswith("fails differently")
    assert "unsupported (Fail" in (found.tested["1.20.1"].reason or "")
    newest = found.tested[HOST]
    assert newest.verdict == "bad", newest.reason
    assert "raised as Fail where the bundle records RuntimeException" in (newest.reason or "")
    assert "crash-load (Fail: [ONNXRuntimeError] : 1 : FAIL" in (newest.observed or "")
    assert found.tested["1.21.0"].verdict == "bad"
    assert "from the oldest testable, 1.21.0" in found.paragraph


def test_the_range_comes_from_the_package_index(opset22_bundle: Path, cache: Path) -> None:
    try:
        listed = index_versions("onnxruntime")
    except InputError as exc:
        pytest.skip(f"no package index: {exc}")
    if not {"1.20.1", *MORE, "1.22.1"} <= set(listed):
        pytest.skip(f"the index lacks a release of the range: {listed}")
    found = gb.releases(opset22_bundle, package="onnxruntime", within="1.20.1..1.22.1", find="fixed", cache=cache)
    assert found.versions == ("1.20.1", *MORE, "1.22.1")
    assert (found.last_bad, found.first_fixed, found.installs) == ("1.20.1", "1.21.0", 0)


@pytest.fixture(scope="module")
def layernorm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("releases") / "layernorm.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), path)
    return path


def test_on_a_model_the_oracle_runs_once_and_the_newest_release_says_what_the_failure_is(
        layernorm_model: Path, cache: Path, tmp_path: Path) -> None:
    """The model (no bundle): this interpreter's oracle runs once, the newest release's run is the failure
    (identity: the fused LayerNorm), and the releases are judged against both."""
    out = tmp_path / "model.json"
    code = main(["releases", str(layernorm_model), "--package", "onnxruntime", "--versions", f"1.17.3,1.22.1,{HOST}",
                 "--cache", str(cache), "--json", str(out)])
    assert code == 1  # present in every release: nothing to bisect
    found = json.loads(out.read_text())
    assert found["oracle"] == "onnxruntime:opt_level=disable" and found["oracle_runs"] == 1
    assert "compiled as LayerNormalization made by LayerNormFusion" in found["recorded"]
    assert found["status"] == "present-in-oldest"
    assert found["tested"][HOST]["verdict"] == "bad" and found["tested"][HOST]["magnitude"] > 1
    old = found["tested"]["1.17.3"]
    assert old["verdict"] == "bad" and "names no pass" in old["reason"] and old["runs"] == 3
    assert "1.22.1" not in found["tested"]  # both ends decided it
    assert "against the oracle onnxruntime:opt_level=disable (run once)" in found["paragraph"]


def test_on_a_model_a_bundles_failure_is_searched_for_and_a_sibling_is_not_it(
        layernorm_model: Path, cache: Path, tmp_path: Path) -> None:
    """``--bundle``: the failure of a bundle reduced with the LayerNorm fusion disabled (SimplifiedLayerNormFusion's
    6-node core) searched on the whole model, where every release fuses the 9 nodes by LayerNormFusion instead:
    another failure everywhere, so every release is a skip and nothing is found."""
    sibling = tmp_path / "sibling"
    gb.reduce(pattern_model("layernorm_keepdims0"), sibling,
              target="onnxruntime:opt_level=all,disabled=LayerNormFusionL1;LayerNormFusionL2")
    found = gb.releases(layernorm_model, package="onnxruntime", versions=["1.17.3", HOST], cache=cache, repeat=1,
                        failure_bundle=sibling)
    assert found.status == "untestable" and not found.found
    assert "SimplifiedLayerNormalization made by SimplifiedLayerNormFusion" in found.recorded
    for version in ("1.17.3", HOST):
        assert (found.tested[version].reason or "").startswith("fails differently"), found.tested[version]
    assert found.oracle_runs == 1


def test_on_a_model_the_release_that_fixed_it_is_found_from_the_oldest_releases_failure(
        cache: Path, tmp_path: Path) -> None:
    """``find="fixed"`` on a model stamped opset 22: the oldest release (1.20.1) refuses it, and that refusal is
    the failure; 1.21.0 is the first release that loads it."""
    model = tmp_path / "opset22.onnx"
    onnx.save(_at_opset_22(pattern_model("relu_clip_f32")), model)
    found = gb.releases(model, package="onnxruntime", versions=["1.20.1", *MORE, "1.22.1"], find="fixed",
                        cache=cache)
    assert (found.last_bad, found.first_fixed) == ("1.20.1", "1.21.0")
    assert found.recorded.startswith("unsupported") and "till opset 21" in found.recorded
    assert found.tested["1.20.1"].runs == 3 and found.oracle_runs == 1 and found.installs == 0
    # what changed, asked of the model while its reference is still there: 1.20.1 cannot build it, 1.21.0 can
    assert found.changed is not None and found.changed.older.fired is None and found.changed.newer.fired is not None
    assert "till opset 21" in (found.changed.older.error or "") and "/tmp" not in (found.changed.older.error or "")


def test_what_changed_between_two_releases_compares_passes_as_optimizers(layernorm_bundle: Path,
                                                                        ort_release_pythons: dict[str, Path]) -> None:
    """1.17.3 and 1.20.1 both mis-fuse the LayerNorm, the pass registered as LayerNormFusion in one and
    LayerNormFusionL1 in the other: not a change. 1.17.3 also fires ConstantSharing and SkipLayerNormFusion on it,
    and names no pass in its fused node."""
    def at(version: str) -> tuple[str, BackendSpec]:
        return version, BackendSpec.parse(f"onnxruntime:opt_level=all,python={ort_release_pythons[version]}")

    with load_bundle(layernorm_bundle) as bundle:
        change = release_change(bundle, at("1.17.3"), at("1.20.1"))
    assert "LayerNormFusion" in (change.older.fired or ()) and "LayerNormFusionL1" in (change.newer.fired or ())
    assert change.only_newer == ()
    assert "LayerNormFusion" not in change.only_older and "ConstantSharing" in change.only_older
    assert change.older.region == ("LayerNormalization (named by no pass)",)
    assert change.newer.region == ("LayerNormalization made by LayerNormFusion",)
    assert "in 1.20.1 and not in 1.17.3: none" in change.describe()


def test_the_answer_is_checked_by_plain_runs_and_a_wrong_one_is_caught(opset22_bundle: Path, cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker re-establishes the two claims an answer rests on, with 2 target runs and 1 oracle run: the
    honest answer (1.20.1 still refuses the model as recorded, 1.21.0 runs it right) holds; a wrong answer the
    search is made to give (1.21.0 the last bad, 1.22.1 the first fixed) is caught — 1.21.0 does not fail — and is
    not stated as a fact, in the paragraph, the --json audit nor the bundle's Releases section."""
    versions = ["1.20.1", "1.21.0", "1.22.1"]
    with load_bundle(opset22_bundle) as bundle:
        honest = search_releases(bundle, "onnxruntime", versions=versions, find="fixed", cache=cache, repeat=1)
    assert (honest.last_bad, honest.first_fixed) == ("1.20.1", "1.21.0")
    assert honest.audit is not None and honest.audit["holds"] is True and honest.confirmed and not honest.refuted
    assert honest.audit["runs"] == {"oracle": 1, "target": 2}
    assert [c["id"] for c in honest.audit["claims"]] == ["last_bad", "first_fixed"]
    assert "The checker re-established both with 2 target and 1 oracle plain runs" in honest.paragraph
    assert "is fixed in onnxruntime 1.21.0" in honest.paragraph

    def wrong(n: int, ask: Any) -> Change:  # the search's bookkeeping, wrong by one release
        ask(1), ask(2)
        return Change(FOUND, 1, 2, (), (1, 2))

    monkeypatch.setattr("graphbisect.workflows.releases.find_change", wrong)
    out = opset22_bundle.parent / "wrong.json"
    code = main(["releases", str(opset22_bundle), "--package", "onnxruntime", "--versions", ",".join(versions),
                 "--find", "fixed", "--cache", str(cache), "--repeat", "1", "--json", str(out)])
    assert code == 1  # a refuted answer is none found: a CI job reading the exit code takes no false release
    found = json.loads(out.read_text())
    assert (found["last_bad"], found["first_fixed"]) == ("1.21.0", "1.22.1")
    held = {c["id"]: c["holds"] for c in found["audit"]["claims"]}
    assert held == {"last_bad": False, "first_fixed": True} and found["audit"]["holds"] is False
    assert "within tolerance" in found["audit"]["claims"][0]["evidence"]
    assert "is fixed in" not in found["paragraph"]
    assert "NOT confirmed by the checker's 2 target and 1 oracle plain runs" in found["paragraph"]
    assert "onnxruntime 1.21.0 fails the same way as the recorded failure: DOES NOT HOLD" in found["paragraph"]
    report_md = (opset22_bundle / "report.md").read_text()
    assert "**last bad 1.21.0, first fixed 1.22.1** — the search's answer, NOT confirmed by the checker" in report_md
    assert "**DOES NOT HOLD**" in report_md
    recorded = json.loads((opset22_bundle / "report.json").read_text())
    assert recorded["releases"]["fixed"]["audit"]["holds"] is False


def _qdq_conv_with_float_bias() -> onnx.ModelProto:
    """A fake-quantized Conv as quantization-aware exporters write it (onnxruntime#24398's SimpleConv: Q/DQ on the
    input, DQ on int8 weights, the bias left in float). ONNX Runtime 1.21.0 added WeightBiasQuantization
    (onnxruntime#22889), which quantizes that bias to int32 with scale input_scale * weight_scale: 0.3 and -0.1
    on a 0.5 grid become 0.5 and 0, so every output is off by 0.2 and 0.1 (~700× the default tolerance)."""
    from onnx import TensorProto, helper, numpy_helper

    values = {"xs": np.array(1.0, np.float32), "xz": np.array(0, np.int8),
              "wq": np.array([1, 3], np.int8).reshape(2, 1, 1, 1), "ws": np.array([0.5, 0.5], np.float32),
              "wz": np.array([0, 0], np.int8), "b": np.array([0.3, -0.1], np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_conv_float_bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                           [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [numpy_helper.from_array(value, name) for name, value in values.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _range_or_versions(within: str, versions: list[str]) -> list[str]:
    """``--range within`` where the package index answers, else the same releases named (offline)."""
    try:
        listed = index_versions("onnxruntime")
    except InputError:
        return ["--versions", ",".join(versions)]
    return ["--range", within] if set(versions) <= set(listed) else ["--versions", ",".join(versions)]


def test_a_real_wrong_result_regression_is_found_in_the_release_that_introduced_it(cache: Path,
                                                                                  tmp_path: Path) -> None:
    """onnxruntime#24398 ("Numerical mismatch between ORT 1.21.0 and PyTorch" on a quantized SimpleConv;
    "Downgrading ORT to 1.20.2 solves this issue"): the first bad release is 1.21.0, and what changed is the pass
    onnxruntime#22889 added, WeightBiasQuantization; both claims re-established by the checker. Looked at the other
    way, 1.22.0 computes it right again (measured here: it no longer fires the pass on this model)."""
    model = tmp_path / "qdq_conv.onnx"
    onnx.save(_qdq_conv_with_float_bias(), model)
    out = tmp_path / "bad.json"
    assert main(["releases", str(model), "--package", "onnxruntime", "--cache", str(cache), "--json", str(out),
                 *_range_or_versions("1.20.1..1.21.1", ["1.20.1", "1.21.0", "1.21.1"])]) == 0
    found = json.loads(out.read_text())
    assert (found["last_good"], found["first_bad"]) == ("1.20.1", "1.21.0")
    assert found["tested"]["1.21.0"]["magnitude"] > 100 and found["installs"] == 0
    assert "WeightBiasQuantization" in found["changed"]["only_newer"]
    assert found["audit"]["holds"] is True and found["audit"]["runs"] == {"oracle": 1, "target": 2}
    assert "first appears in onnxruntime 1.21.0" in found["paragraph"]
    fixed = tmp_path / "fixed.json"
    assert main(["releases", str(model), "--package", "onnxruntime", "--cache", str(cache), "--json", str(fixed),
                 "--find", "fixed", *_range_or_versions("1.21.0..1.22.1", ["1.21.0", *MORE[1:], "1.22.1"])]) == 0
    gone = json.loads(fixed.read_text())
    assert (gone["last_bad"], gone["first_fixed"]) == ("1.21.1", "1.22.0") and gone["audit"]["holds"] is True
    assert "WeightBiasQuantization" in gone["changed"]["only_older"]


# --- a command: target's package: the user's own program, run by each release's environment -------------------
def test_a_users_program_run_by_each_release_finds_the_release_the_built_in_backend_finds(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime#24398 again, the target a user's own script (``python run.py {model} {inputs} {outputs}``, which
    runs the model with whatever onnxruntime its ``python`` imports): each release's environment comes first on the
    program's PATH, so ``python`` is that release's, and the release it held is measured there, not assumed. The
    answer is the built-in backend's: 1.20.1 → 1.21.0, both claims re-established by the checker."""
    from tests.ort_releases import write_ort_runner

    runner = write_ort_runner(tmp_path)
    monkeypatch.chdir(tmp_path)  # where a command runs (a relative run.py is found here)
    model = tmp_path / "qdq_conv.onnx"
    onnx.save(_qdq_conv_with_float_bias(), model)
    out = tmp_path / "command.json"
    assert main(["releases", str(model), "--package", "onnxruntime", "--cache", str(cache), "--json", str(out),
                 "--versions", "1.20.1,1.21.0,1.21.1", "--target", "command:cmd=python run.py {model} {inputs} "
                 "{outputs}"]) == 0
    found = json.loads(out.read_text())
    assert (found["last_good"], found["first_bad"]) == ("1.20.1", "1.21.0") and found["installs"] == 0
    assert found["target"] == "command:cmd=python run.py {model} {inputs} {outputs}"
    assert found["tested"]["1.21.0"]["magnitude"] > 100
    # measured in each release's environment, by the python the command ran: the release asked for, every one
    for version, run in found["tested"].items():
        assert run["library_version"] == version, run
    assert found["audit"]["holds"] is True and found["audit"]["runs"] == {"oracle": 1, "target": 2}
    assert "the release there was measured by that environment's python (importlib.metadata), not assumed: " \
        "onnxruntime 1.20.1, 1.21.0, 1.21.1 as asked." in found["paragraph"]
    assert found["changed"] is None  # a program says nothing of its passes
    assert runner.exists()


def test_a_command_target_whose_environment_holds_another_release_is_a_skip(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release a ``command:`` target ran is what its environment's python reports, never the folder's name: a
    cached environment named 1.21.0 that holds 1.21.1 is a skip saying so, and the answer names it as untested
    between the last good release and the first bad one."""
    from tests.ort_releases import write_ort_runner

    write_ort_runner(tmp_path)
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "qdq_conv.onnx"
    onnx.save(_qdq_conv_with_float_bias(), model)
    mixed = tmp_path / "cache"
    mixed.mkdir()
    for name, source in (("1.20.1", "1.20.1"), ("1.21.0", "1.21.1"), ("1.21.1", "1.21.1")):
        (mixed / f"onnxruntime-{name}-py3.11").symlink_to(cache / f"onnxruntime-{source}-py3.11")
    found = gb.releases(model, package="onnxruntime", versions=["1.20.1", "1.21.0", "1.21.1"], cache=mixed,
                        repeat=1, target="command:cmd=python run.py {model} {inputs} {outputs}")
    mislabelled = found.tested["1.21.0"]
    assert mislabelled.verdict == "skip" and mislabelled.reason == "its environment runs 1.21.1, not 1.21.0"
    assert (found.last_good, found.first_bad, found.skipped_between) == ("1.20.1", "1.21.1", ("1.21.0",))
    assert "onnxruntime 1.20.1, 1.21.1 as asked; the environment of 1.21.0 held 1.21.1 (a skip)." in found.paragraph


def test_a_recorded_command_target_needs_trust_and_its_environment_is_each_releases(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle reduced with a ``command:`` target (the user's program in this interpreter's environment:
    FuseReluClip's float64 crash) records a program chosen by whoever wrote the bundle: refused without
    ``--trust``, before any environment is made. With it, each release runs the program with its own environment
    instead of the recorded one (``venv=`` replaced, like ``python=``), and the release it held is measured."""
    import sys

    from tests.ort_releases import write_ort_runner

    write_ort_runner(tmp_path)
    monkeypatch.chdir(tmp_path)
    bundle = tmp_path / "clip"
    gb.reduce(pattern_model("relu_clip_f64"), bundle,
              target=f"command:cmd=python run.py {{model}} {{inputs}} {{outputs}},venv={sys.prefix}")
    search = ["releases", str(bundle), "--package", "onnxruntime", "--versions", "1.20.1,1.22.1", "--repeat", "1",
              "--no-section"]
    assert main([*search, "--cache", str(tmp_path / "empty")]) == 2 and not (tmp_path / "empty").exists()
    out = tmp_path / "trusted.json"
    assert main([*search, "--cache", str(cache), "--trust", "--json", str(out)]) == 1
    found = json.loads(out.read_text())
    assert found["status"] == "present-in-oldest" and found["target"].startswith("command:cmd=python run.py")
    assert "venv" not in found["target"]
    assert {v: run["library_version"] for v, run in found["tested"].items()} == {"1.20.1": "1.20.1",
                                                                                   "1.22.1": "1.22.1"}


def test_a_package_outside_the_table_needs_a_command_target(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(pattern_model("relu_clip_f32"), model)
    assert main(["releases", str(model), "--package", "tflite-runtime", "--versions", "2.13.0,2.14.0"]) == 2
    err = capsys.readouterr().err
    assert "no backend of its own for 'tflite-runtime'" in err
    assert "--target 'command:cmd=python run.py {model} {inputs} {outputs}'" in err
    with pytest.raises(InputError, match=r"no backend of its own"):
        gb.releases(model, package="tflite-runtime", versions=["2.13.0", "2.14.0"], target="onnxruntime")
    assert main(["releases", str(model), "--package", "../evil", "--versions", "1,2", "--target",
                 "command:cmd=python run.py {model}"]) == 2
    assert "is not a distribution's name" in capsys.readouterr().err
