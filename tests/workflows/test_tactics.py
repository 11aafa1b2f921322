"""`graphbisect tactics` end to end on real OpenVINO: isolate names exactly the kernel swaps that matter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")

from graphbisect.cli.main import main
from graphbisect.errors import BackendError
from graphbisect.model import load_model
from graphbisect.tactics import TacticRecord, load_record, save_record
from graphbisect.workflows.tactics import (
    EXACT,
    ReplayResult,
    _Builder,
    _classify_builds,
    _Judge,
    _prepare,
    _tactics_spec,
    isolate_tactics,
    record_tactics,
    replay_tactics,
)
from tests.tactics.tactics_builders import save_cnn

pytestmark = pytest.mark.openvino

# Candidate swaps; which of them change the numbers on this CPU is measured, not assumed.
SWAPS = {"conv0": "jit_avx512", "conv1": "ref_any", "conv2": "ref_any", "matmul1": "jit_gemm", "softmax": "ref_any"}


def test_isolate_names_exactly_the_swaps_that_change_outputs(tmp_path: Path) -> None:
    model = load_model(save_cnn(tmp_path))
    a = record_tactics(model, "openvino").record
    base = replay_tactics(model, "openvino", a)
    assert not base.not_applied
    swaps = {n: c for n, c in SWAPS.items() if a.choice_of(n) not in (None, c)}
    changing, applied = set(), {}
    for node, choice in swaps.items():
        single = replay_tactics(model, "openvino", a.with_choices({node: choice}))
        if single.not_applied:
            continue  # a silent fallback is another kernel than the one asked for: keep the test exact
        applied[node] = choice
        if not np.array_equal(single.run.outputs["y"], base.run.outputs["y"]):
            changing.add(node)
    if len(changing) < 2 or len(changing) == len(applied):
        pytest.skip(f"this CPU needs other swaps: changing={changing} of {sorted(swaps)}")
    result = isolate_tactics(model, "openvino", good=a, bad=a.with_choices(applied))
    assert {c.node for c in result.isolation.culprits} == changing
    assert result.isolation.confirmed and result.isolation.minimal
    assert result.invocations["target"] <= 4 * len(applied) + 2


def test_cli_record_diff_isolate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save_cnn(tmp_path)
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "iso.json"
    assert main(["tactics", "record", str(model), "-o", str(a)]) == 0
    rec = load_record(a)
    if rec.choice_of("conv2") == "ref_any":
        pytest.skip("conv2 already runs the reference kernel here")
    save_record(rec.with_choices({"conv2": "ref_any"}), b)
    assert main(["tactics", "diff", str(a), str(b)]) == 1
    capsys.readouterr()
    assert main(["tactics", "isolate", str(model), "--good", str(a), "--bad", str(b), "--json", str(out)]) == 1
    assert capsys.readouterr().out.startswith("1 differing choice; ")  # it said "1 differing choice(s)"
    data = json.loads(out.read_text())
    assert [c["node"] for c in data["culprits"]] == ["conv2"]
    assert data["culprits"][0] == {"node": "conv2", "good_choice": rec.choice_of("conv2"), "bad_choice": "ref_any",
                                   "applied": True}
    assert data["builds"] and data["invocations"]["target"] >= 2


def test_isolate_among_perturbed_builds_sorts_them_by_the_oracle(tmp_path: Path) -> None:
    """`--builds N --perturb IMPL`: several builds, sorted good/bad by the oracle, then isolated by replay."""
    model = save_cnn(tmp_path)
    out = tmp_path / "isolate.json"
    code = main(["tactics", "isolate", str(model), "--builds", "4", "--perturb", "ref_any", "--oracle", "openvino",
                 "--atol", "0", "--rtol", "0", "--json", str(out)])
    data = json.loads(out.read_text())
    roles = {build["role"] for build in data["builds"]}
    if roles != {"good", "bad"}:
        pytest.skip(f"on this CPU every perturbed build was {roles}: nothing to isolate")
    assert code == 1 and data["culprits"]
    assert all(c["bad_choice"] == "ref_any" and c["applied"] for c in data["culprits"])
    assert data["invocations"]["target"] >= 2


def test_every_build_of_builds_n_is_a_fresh_unpinned_build(tmp_path: Path) -> None:
    """`--builds N` without `--perturb` claims N builds sorted by the oracle: each must be compiled anew with
    nothing pinned, not a replay of the first build's kernels nor a rerun of an earlier session (which the
    worker reports as ``session_reused``)."""
    model = load_model(save_cnn(tmp_path))
    onnx_path, inputs_path = _prepare(model, None, tmp_path, 0)
    builder = _Builder(_tactics_spec("openvino"), tmp_path, onnx_path, inputs_path)
    reference = builder.build(TacticRecord("", None, None))
    verdict = _Judge({k: np.array(v) for k, v in reference.run.outputs.items()}, EXACT, model.output_names)
    builds: list[ReplayResult] = []
    build = builder.build

    def observed(record: TacticRecord, **options: bool) -> ReplayResult:  # the real build, watched
        builds.append(build(record, **options))
        return builds[-1]

    builder.build = observed  # type: ignore[method-assign]
    try:
        with pytest.raises(BackendError, match="all 3 builds were good"):
            _classify_builds(builder, verdict, 3, (), 0)
    finally:
        builder.close()
    assert [b.run.info["session_reused"] for b in builds] == [False, False, False]
    assert [b.requested.choices for b in builds] == [(), (), ()]
    assert [b.run.info["tactics_pinned"] for b in builds] == [{}, {}, {}]
