"""ONNX Runtime backends under another interpreter (``python=``), on older releases (``tests/ort_releases.py``).

ORT 1.17-1.22 log only ``GraphTransformer <name> modified: N`` lines (no ``Applying graph transformer`` line,
which 1.31 added), so the optimizer catalogue, the fired passes and the ``disabled=`` checks must come from
those lines and be computed by the worker's own ORT.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from graphbisect.backends import BackendProcess
from graphbisect.errors import SpecError
from graphbisect.examples.patterns import pattern_model
from tests.ort_releases import LAYERNORM_FUSION, ORT_RELEASES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("release", ORT_RELEASES)
def test_fired_transformers_and_rewrite_rules_on_another_release(release: str, ort_release_pythons: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    python = ort_release_pythons[release]
    fired = {}
    with BackendProcess(f"onnxruntime:opt_level=all,report_passes=1,python={python}", workdir=tmp_path) as ort:
        for name in ("layernorm_keepdims0", "relu_clip_f32"):  # a transformer fusion, a Level-1 rewrite rule
            path = tmp_path / f"{name}.onnx"
            onnx.save(pattern_model(name), path)
            result = ort.run(path, str(_inputs(tmp_path)))
            assert result.ok, result.describe()
            fired[name] = result.info
        assert ort.ran_with["library_version"] == release and ort.ran_with["python"] == str(python)
        assert result.ran_with["library_version"] == release and result.info["library_version"] == release
        assert LAYERNORM_FUSION[release] in ort.registered_passes()  # asked of the worker's ORT
    assert LAYERNORM_FUSION[release] in fired["layernorm_keepdims0"]["fired_passes"]
    assert "FuseReluClip" in fired["relu_clip_f32"]["fired_passes"]  # the rule, not its rule set
    for info in fired.values():
        assert not {LAYERNORM_FUSION[release], "Level1_RuleBasedTransformer"} & set(info["fired_required"])


@pytest.mark.parametrize("release", ORT_RELEASES[:1])
def test_disabled_names_are_checked_against_the_worker_release(release: str, ort_release_pythons: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """``LayerNormFusionL1`` exists in the current ORT but not in 1.17, which would silently ignore it."""
    python = ort_release_pythons[release]
    with BackendProcess(f"onnxruntime:disabled=LayerNormFusion,python={python}", workdir=tmp_path / "a") as ort:
        ort.validate()
    with BackendProcess(f"onnxruntime:disabled=LayerNormFusionL1,python={python}", workdir=tmp_path / "b") as ort, \
            pytest.raises(SpecError, match=f"onnxruntime {release} has no optimizer named 'LayerNormFusionL1'"):
        ort.validate()


def _inputs(folder: Path) -> Path:
    import numpy as np

    path = folder / "x.npz"
    np.savez(path, x=np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    return path


def test_backends_lists_what_another_interpreter_runs(ort_release_pythons: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import json

    from graphbisect.cli.main import main

    release = ORT_RELEASES[-1]
    assert main(["backends", "--json", "--python", str(ort_release_pythons[release])]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["backends"]}
    assert rows["onnxruntime"]["available"] and rows["onnxruntime"]["version"] == release
    assert not rows["reference"]["available"]  # that venv has only numpy and onnxruntime
    assert not rows["command"]["available"]  # runs a program, never under python=
    assert main(["backends", "--python", str(tmp_path / "no-python")]) == 2
