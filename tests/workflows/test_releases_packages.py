"""`graphbisect releases` on real releases of packages other than ONNX Runtime (OpenVINO, onnx), each in its cached
environment (the folder tests/ort_releases.py keeps, shared; made here once: ~40 MB of wheels an OpenVINO release,
~15 MB an onnx one). Skipped where an environment cannot be made (no package index).

Measured per release on CPU, Python 3.11 (numpy 1.26 in every environment):
* a one-node Mish model (opset 18) is refused by OpenVINO 2023.3.0 and 2024.0.0 ("OpenVINO does not support the
  following ONNX operations: Mish") and runs on 2024.6.0, 2025.0.0 and later; 2024.0.0 words the refusal otherwise
  (its message is wrapped in "... Front End API failed with GeneralFailure: ..."): another message, so a skip;
* a ReduceL2 (opset 18, its axes an input) gives 2023.3.0 and 2024.0.0 an output of shape (1, 1, 1, 1) where
  (2, 3, 1, 5) is right (every axis reduced), and the right one on 2024.6.0 and later;
* OpenVINO 2023.0.2 has no ``openvino.Core`` (the top-level API graphbisect's OpenVINO worker uses came in 2023.1):
  it cannot run the target, a skip with that reason;
* onnx.reference's BlackmanWindow in onnx 1.14.1 is not symmetric (0.33997685 where 1.15.0 and ONNX Runtime give
  0.34, ~9e-5 off): a wrong result, gone in 1.15.0;
* onnx.reference's GroupNormalization-21 (one group, a scale per channel) raises "cannot reshape array of size 360
  into shape (2,3,4,5)" in 1.15.0 and runs in 1.16.2; 1.14.1 fails on the model otherwise ("Unable to return type
  for name 's'");
* any other package, with a ``command:`` target: ml_dtypes 0.4.1 has no ``float8_e8m0fnu`` (the OCP MX scale
  type), 0.5.0 and 0.5.1 have it (~3 MB of wheels a release, numpy from the installer's cache).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphbisect as gb
from graphbisect.artifacts.bundle import load_bundle
from graphbisect.cli.main import main
from graphbisect.releases.environments import prepare_environments
from graphbisect.releases.packages import Recipe, recipe_of
from tests.ort_releases import _root

#: The releases under test: one that cannot run graphbisect's worker, two that refuse Mish, one that runs it.
OV_RELEASES = ("2023.0.2", "2023.3.0", "2024.0.0", "2024.6.0")
ONNX_RELEASES = ("1.14.1", "1.15.0", "1.16.2")


def _made(package: str | Recipe, versions: tuple[str, ...]) -> Path:
    """The shared release environments, with ``versions`` of ``package`` made (skipped where they cannot be)."""
    envs = prepare_environments(package, list(versions), cache=_root(), use_host=False, jobs=len(versions))
    missing = [f"{v}: {env.error}" for v, env in envs.items() if env.error]
    if missing:
        pytest.skip(f"cannot make the {package} release environments: {missing}")
    return _root()


@pytest.fixture(scope="module")
def cache() -> Path:
    return _made("openvino", OV_RELEASES)


@pytest.fixture(scope="module")
def onnx_cache() -> Path:
    return _made("onnx", ONNX_RELEASES)


def _model(folder: Path, node: onnx.NodeProto, opset: int, shape: list[int],
           initializers: tuple[onnx.TensorProto, ...] = ()) -> Path:
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in node.input
              if name not in {init.name for init in initializers}]
    graph = helper.make_graph([node], node.op_type, inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers))
    path = folder / f"{node.op_type}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def mish_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("openvino"), helper.make_node("Mish", ["x"], ["y"], name="mish"), 18,
                  [2, 3, 4, 5])


def test_the_openvino_release_that_runs_an_op_it_refused_is_found(mish_model: Path, cache: Path,
                                                                  tmp_path: Path) -> None:
    """``--find fixed`` on a model: the oldest release cannot start graphbisect's worker (a skip, and the baseline
    moves to the next), 2023.3.0's refusal of Mish is the failure, 2024.6.0 the first release that runs it."""
    out = tmp_path / "mish.json"
    code = main(["releases", str(mish_model), "--package", "openvino", "--versions", ",".join(OV_RELEASES),
                 "--find", "fixed", "--cache", str(cache), "--json", str(out)])
    assert code == 0
    found = json.loads(out.read_text())
    assert (found["last_bad"], found["first_fixed"]) == ("2023.3.0", "2024.6.0")
    assert found["target"] == "openvino" and found["oracle_runs"] == 1 and found["installs"] == 0
    assert "OpenVINO does not support the following ONNX operations: Mish" in found["recorded"]
    oldest = found["tested"]["2023.0.2"]
    assert oldest["verdict"] == "skip" and oldest["reason"].startswith("cannot run")
    assert "has no attribute 'Core'" in oldest["reason"]
    assert found["tested"]["2023.3.0"]["verdict"] == "bad" and found["tested"]["2023.3.0"]["runs"] == 3
    fixed = found["tested"]["2024.6.0"]
    assert fixed["verdict"] == "good" and fixed["library_version"].startswith("2024.6.0-")
    between = found["tested"]["2024.0.0"]
    assert between["verdict"] == "skip" and between["reason"].startswith("fails differently")
    assert found["skipped_between"] == ["2024.0.0"]
    assert "is fixed in openvino 2024.6.0" in found["paragraph"] and "(2024.0.0): the change may be" in \
        found["paragraph"]
    # the checker matches 2023.3.0's refusal to the baseline's message as a bundle records it (ErrorType: message)
    assert found["audit"]["holds"] is True and found["audit"]["runs"] == {"oracle": 1, "target": 2}


def test_on_a_bundle_the_openvino_release_that_fixed_a_wrong_shape_is_found(cache: Path, tmp_path: Path) -> None:
    """A bundle reduced on 2024.0.0 (its ReduceL2 output of the wrong shape: no magnitude to say, which the JSON
    of the answer and the bundle's report.json hold as null), searched with ``--find fixed``."""
    model = _model(tmp_path, helper.make_node("ReduceL2", ["x", "axes"], ["y"]), 18, [2, 3, 4, 5],
                   (onnx.numpy_helper.from_array(np.array([2], np.int64), "axes"),))
    bundle = tmp_path / "reducel2"
    gb.reduce(model, bundle, target=f"openvino:python={_python(cache, 'openvino', '2024.0.0')}")
    out = tmp_path / "found.json"
    assert main(["releases", str(bundle), "--package", "openvino", "--versions", "2023.3.0,2024.0.0,2024.6.0",
                 "--find", "fixed", "--repeat", "1", "--cache", str(cache), "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert (found["last_bad"], found["first_fixed"]) == ("2024.0.0", "2024.6.0")
    assert found["recorded"].startswith("structure (shape)")
    assert found["tested"]["2024.0.0"]["verdict"] == "bad" and found["tested"]["2024.0.0"]["magnitude"] is None
    assert found["tested"]["2024.6.0"]["verdict"] == "good"
    with load_bundle(bundle) as reread:  # the Releases section added, the bundle whole
        assert reread.report["releases"]["fixed"]["first_fixed"] == "2024.6.0"


def _python(cache: Path, package: str, version: str) -> Path:
    return cache / f"{package}-{version}-py{sys.version_info.major}.{sys.version_info.minor}" / "bin" / "python"


def test_the_onnx_release_that_fixed_a_wrong_reference_result_is_found(onnx_cache: Path, tmp_path: Path) -> None:
    """The reference backend (onnx.reference) moves, ONNX Runtime (this interpreter's) is the oracle: 1.14.1's
    BlackmanWindow is ~19× a tight tolerance off, a wrong result matched by its identity; 1.15.0 is right."""
    model = _model(tmp_path, helper.make_node("BlackmanWindow", ["n"], ["y"]), 17, [],
                   (onnx.numpy_helper.from_array(np.array(8, np.int64), "n"),))
    found = gb.releases(model, package="onnx", versions=list(ONNX_RELEASES), find="fixed", atol=1e-6, rtol=1e-5,
                        cache=onnx_cache)
    assert (found.last_bad, found.first_fixed) == ("1.14.1", "1.15.0")
    assert found.target == "reference" and found.recorded.startswith("mismatch")
    assert "node 'BlackmanWindow_0'" in found.recorded
    bad = found.tested["1.14.1"]
    assert bad.verdict == "bad" and bad.magnitude is not None and 10 < bad.magnitude < 30
    assert found.tested["1.15.0"].verdict == "good" and found.tested["1.15.0"].library_version == "1.15.0"
    # at the default tolerance (1e-4 + 1e-3 × |y|) the asymmetry passes: nothing to find, said
    loose = gb.releases(model, package="onnx", versions=list(ONNX_RELEASES), find="fixed", cache=onnx_cache)
    assert loose.status == "present-in-oldest" and loose.tested["1.14.1"].verdict == "good"


def test_an_onnx_reference_crash_fixed_in_a_later_release_steps_around_one_failing_otherwise(
        onnx_cache: Path, tmp_path: Path) -> None:
    """GroupNormalization-21 on a bundle reduced on 1.15.0 (its crash): 1.14.1 fails otherwise (a skip, stepped
    around), 1.16.2 runs it."""
    model = _model(tmp_path, helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=1), 21,
                   [2, 3, 4, 5], (onnx.numpy_helper.from_array(np.ones(3, np.float32), "s"),
                                  onnx.numpy_helper.from_array(np.zeros(3, np.float32), "b")))
    bundle = tmp_path / "groupnorm"
    gb.reduce(model, bundle, target=f"reference:python={_python(onnx_cache, 'onnx', '1.15.0')}")
    found = gb.releases(bundle, package="onnx", versions=list(ONNX_RELEASES), find="fixed", cache=onnx_cache,
                        repeat=1)
    assert (found.last_bad, found.first_fixed) == ("1.15.0", "1.16.2")
    assert "cannot reshape array of size 360" in found.recorded
    older = found.tested["1.14.1"]
    assert older.verdict == "skip" and "Unable to return type for name 's'" in (older.reason or "")


#: A user's program that needs a type ml_dtypes added in 0.5.0, and computes the Relu + Clip(0, 6) model with numpy.
MX_SCALE_PROGRAM = """\
import sys

import ml_dtypes
import numpy as np

model, inputs, outputs = sys.argv[1:4]
ml_dtypes.finfo(ml_dtypes.float8_e8m0fnu)  # the OCP MX scale type
with np.load(inputs) as feeds:
    np.savez(outputs, y=np.minimum(np.maximum(feeds["x"], 0), 6))
"""


def test_any_package_runs_a_command_target_in_each_releases_environment(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ml_dtypes is in no row of the table: with a ``command:`` target each release gets ``ml_dtypes==V`` and numpy
    in an environment of its own, the program runs with it first on PATH, and the release is measured there. The
    program fails (an AttributeError, exit 1) until the release that added float8_e8m0fnu: 0.5.0."""
    from graphbisect.examples.patterns import pattern_model

    versions = ("0.4.1", "0.5.0", "0.5.1")
    cache = _made(recipe_of("ml_dtypes", command=True), versions)
    (tmp_path / "mx.py").write_text(MX_SCALE_PROGRAM)
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "clip.onnx"
    onnx.save(pattern_model("relu_clip_f32"), model)
    out = tmp_path / "found.json"
    assert main(["releases", str(model), "--package", "ml_dtypes", "--versions", ",".join(versions), "--find",
                 "fixed", "--cache", str(cache), "--json", str(out), "--repeat", "1",
                 "--target", "command:cmd=python mx.py {model} {inputs} {outputs}"]) == 0
    found = json.loads(out.read_text())
    assert (found["last_bad"], found["first_fixed"], found["installs"]) == ("0.4.1", "0.5.0", 0)
    assert {v: run["library_version"] for v, run in found["tested"].items()} == {v: v for v in versions}
    assert found["audit"]["holds"] is True
    assert "float8_e8m0fnu" in found["audit"]["claims"][0]["evidence"]  # the program's own error, on 0.4.1
    assert (cache / f"ml_dtypes-0.5.0-py{sys.version_info.major}.{sys.version_info.minor}" / "ready").exists()
