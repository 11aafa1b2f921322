"""analyze_layers with inputs the target did not expose: the error reaching them is estimated, never taken as zero,
and only a run alone makes such a node a root."""

from __future__ import annotations

import numpy as np
from onnx import helper

from graphbisect.compare import Tolerance, compare_values
from graphbisect.localize.layerwise import analyze_layers, ranked_with

#: a → (Relu, exposed, wrong) → b → (Neg, fused away) → c → (Abs, exposed) → y
NODES = [helper.make_node("Relu", ["x"], ["b"], name="relu"), helper.make_node("Neg", ["b"], ["c"], name="neg"),
         helper.make_node("Abs", ["c"], ["y"], name="abs")]
ORACLE = {"b": np.ones(4, np.float32), "c": -np.ones(4, np.float32), "y": np.ones(4, np.float32)}


def test_a_node_behind_an_unexposed_tensor_carries_the_error_upstream_and_is_never_a_root_unrun() -> None:
    target = {"b": np.full(4, 2, np.float32), "y": np.full(4, 2, np.float32)}  # c was not exposed
    report = analyze_layers(NODES, ORACLE, target)
    rows = {row.node: row for row in report.rows}
    assert rows["abs"].hidden_inputs == ("c",) and rows["abs"].input_score == rows["relu"].stats.score
    assert rows["abs"].amplification == 1.0  # the error it received, not 0 → "root" as before
    causes = {c.node: c for c in report.root_causes}
    assert causes["relu"].is_root and causes["relu"].evidence == "measured"
    assert not causes["abs"].is_root and causes["abs"].evidence == "unconfirmed" and causes["abs"].role == "carries"
    assert [row.node for row in report.uncertain] == ["abs"]


def test_a_run_alone_confirms_or_clears_a_node_behind_an_unexposed_tensor() -> None:
    """Everything exposed passes; only what follows the unexposed Neg fails: the error starts in Neg or Abs."""
    tol = Tolerance()
    target = {"b": ORACLE["b"], "y": np.full(4, 3, np.float32)}
    unrun = analyze_layers(NODES, ORACLE, target, tol)
    assert unrun.root_causes[0].role == "uncertain" and not unrun.root_causes[0].is_root
    wrong_alone = {"y": compare_values("y", ORACLE["y"], np.full(4, 3, np.float32), tol)}
    confirmed = analyze_layers(NODES, ORACLE, target, tol, alone=wrong_alone).root_causes[0]
    assert confirmed.is_root and confirmed.evidence == "confirmed" and confirmed.alone_score == wrong_alone["y"].score
    right_alone = {"y": compare_values("y", ORACLE["y"], ORACLE["y"], tol)}
    report = analyze_layers(NODES, ORACLE, target, tol, alone=right_alone)
    assert not report.root_causes[0].is_root and report.root_causes[0].evidence == "received"
    assert report.uncertain == ()
    assert report.root_causes[0].to_json()["evidence"] == "received"
    # compare ranks the table it made before the run alone again instead of making it twice: the same report
    for alone in (wrong_alone, right_alone):
        assert ranked_with(unrun, alone) == analyze_layers(NODES, ORACLE, target, tol, alone=alone)
