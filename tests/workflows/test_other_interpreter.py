"""A target under another interpreter (``python=``) on older ONNX Runtime releases is a first-class target.

Each release runs in its own virtual environment (``tests/ort_releases.py``) while graphbisect, the oracle and
the search run here, on the current release. The results must be those an in-process target of that release
gives (measured by running graphbisect itself under each release; the README's LayerNorm bug,
onnxruntime#30513, at opt_level=all: both LayerNorm fusions each mis-fuse, the reduced model is the 6-node
tail), and every report must name the release that ran, not this interpreter's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from graphbisect.cli.main import main
from graphbisect.examples.hosts import host_inputs, host_network
from graphbisect.model import load_model
from graphbisect.workflows.passes import PassesOptions, find_culprit_passes
from tests.ort_releases import LAYERNORM_FUSION, ORT_RELEASES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def layernorm_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ln-host")
    model, inputs = folder / "ln.onnx", folder / "ln.npz"
    onnx.save(host_network(150, bug="layernorm_keepdims0").model, model)
    np.savez(inputs, **host_inputs())
    return model, inputs


@pytest.mark.parametrize("release", ORT_RELEASES)
def test_passes_and_reduce_on_another_release(release: str, ort_release_pythons: dict[str, Path],
                                              layernorm_host: tuple[Path, Path], tmp_path: Path) -> None:
    python = ort_release_pythons[release]
    model, inputs = layernorm_host
    target = f"onnxruntime:opt_level=all,python={python}"
    code = main(["passes", str(model), "--inputs", str(inputs), "--target", target, "--json",
                 str(tmp_path / "r.json"), "-o", str(tmp_path / "bundle")])
    data = json.loads((tmp_path / "r.json").read_text())
    fusions = {LAYERNORM_FUSION[release], "SimplifiedLayerNormFusion"}
    assert code == 1 and data["source"] == "reported"
    # searched on the region (the second fusion fires there once the first is disabled), disable-able as in-process
    assert data["scope"]["searched_on"] == "region" and data["scope"]["confirmed"]
    assert fusions <= set(data["searched"]) and not fusions & set(data["excluded"])
    assert set(data["culprits"]) == fusions and data["minimal"]
    # the failure's identity is the LayerNormalization the first fusion made: the other mis-fuses the same
    # nodes into another node, another failure (graphbisect.oracle.identity)
    assert data["required"] == data["each_alone"] == [LAYERNORM_FUSION[release]]
    assert data["versions"]["target"]["library_version"] == release
    assert data["versions"]["target"]["python"] == str(python)
    assert data["versions"]["oracle"]["library_version"] == onnxruntime.__version__
    # reduced under the culprit pass, in the other release's worker: the nine nodes it fuses
    assert data["reduce"]["failed"] and data["reduce"]["final_nodes"] == 9 and data["reduce"]["one_minimal"]

    bundle = tmp_path / "bundle"
    report = json.loads((bundle / "report.json").read_text())
    environment = json.loads((bundle / "environment.json").read_text())
    for role in ("target", "control"):  # the control ran the culprits disabled, under the same interpreter
        assert report["versions"][role]["library_version"] == release
        assert environment["backends"][role]["library_version"] == release
        # by name, not where it lives; that it was not graphbisect's interpreter is measured
        assert environment["backends"][role]["python"] == python.name
        assert environment["backends"][role]["own_interpreter"] is False
    assert report["versions"]["oracle"]["library_version"] == onnxruntime.__version__
    assert report["passes"]["control_passes"]
    text = (bundle / "report.md").read_text()
    assert f"onnxruntime {release} (Python" in text  # the Backends table and the Environment section
    assert json.loads((bundle / "repro_config.json").read_text())["recorded_library_version"] == release
    proc = subprocess.run([str(python), str(bundle / "repro.py")], capture_output=True, text=True, timeout=120,
                          check=False)  # the bundle reproduces with only that release's numpy and onnxruntime
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout and "CONTROL PASSES" in proc.stdout


@pytest.mark.parametrize("release", ORT_RELEASES[:1])  # 1.20 and 1.22 measured alike (README); CI time
def test_a_target_crashing_before_it_reports_is_searched_over_its_own_catalogue(
        release: str, ort_release_pythons: dict[str, Path], tmp_path: Path) -> None:
    """FuseReluClip on float64 fails session creation in every release: the search space is every optimizer
    the *worker's* release registers (asked of the worker), as for an in-process target."""
    python = ort_release_pythons[release]
    model = load_model(host_network(100, bug="relu_clip_f64").model)
    result = find_culprit_passes(model, inputs=host_inputs(), workdir=tmp_path,
                                 options=PassesOptions(target=f"onnxruntime:opt_level=all,python={python}"))
    assert result.signature.kind.value == "crash-load" and result.source == "catalogue"
    assert result.culprits == ("FuseReluClip",) and result.required == ("FuseReluClip",) and result.minimal
    assert LAYERNORM_FUSION[release] in result.fired  # this release's names, not this interpreter's
    assert result.versions["target"]["library_version"] == release  # measured although every run crashed


def test_compare_names_the_release_that_ran(ort_release_pythons: dict[str, Path],
                                            layernorm_host: tuple[Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    release = ORT_RELEASES[0]
    model, inputs = layernorm_host
    code = main(["compare", str(model), "--inputs", str(inputs), "--no-layerwise", "--json", str(tmp_path / "c.json"),
                 "--target", f"onnxruntime:opt_level=all,python={ort_release_pythons[release]}"])
    assert code == 1
    versions = json.loads((tmp_path / "c.json").read_text())["versions"]
    assert versions["target"]["library_version"] == release
    assert versions["oracle"]["library_version"] == onnxruntime.__version__
    assert f"onnxruntime {release} (Python" in capsys.readouterr().out


def test_layerwise_statistics_are_measured_under_the_other_release(ort_release_pythons: dict[str, Path],
                                                                  layernorm_host: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    """The target's worker compares its probe with the oracle's store itself, so under another interpreter
    (numpy 1, no onnx) it must read the store with numpy alone; the table has every row it has here."""
    release = ORT_RELEASES[0]
    model, inputs = layernorm_host
    tables = []
    for python in (ort_release_pythons[release], None):
        spec = "onnxruntime:opt_level=all" + (f",python={python}" if python else "")
        out = tmp_path / f"{'other' if python else 'here'}.json"
        code = main(["compare", str(model), "--inputs", str(inputs), "--json", str(out), "--target", spec])
        assert code == 1
        tables.append(json.loads(out.read_text()))
    other, here = tables
    # plain, probe, and the noise floor: the other release with its optimizations off is not the oracle
    assert other["versions"]["target"]["library_version"] == release and other["invocations"]["target"] == 3
    assert other["noise_floor"]["measured"] and here["invocations"]["target"] == 2
    assert not here["noise_floor"]["measured"]  # here the target with its optimizations off is the oracle
    assert other["first_divergence"] is not None and other["first_divergence"]["compiled_as"] is not None
    assert len(other["layers"]) == len(here["layers"])
