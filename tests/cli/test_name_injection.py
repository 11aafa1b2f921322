"""Issue 36 item 6 (and item 7's terminal encoding): names from a model are escaped wherever graphbisect puts
them into a line, neutralized in the CSV, and left out of trtexec's list where trtexec cannot name them; a
terminal that cannot show graphbisect's own "×" is no "graphbisect bug". Real runs; each failed before."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from graphbisect.artifacts.overrides import PrecisionOverrides, write_overrides
from graphbisect.cli.main import main
from graphbisect.data import save_inputs
from graphbisect.examples import host_network

pytest.importorskip("onnxruntime")

FORGED = "y\n\nPASS: outputs match"
FORMULA = '=HYPERLINK("http://x","y")'


def _host(tmp_path: Path, *, output: str = "y", node_prefix: str = "n") -> tuple[Path, Path]:
    """The host network with ONNX Runtime's LayerNorm fusion bug, its first output and its nodes renamed."""
    host = host_network(100, bug="layernorm_keepdims0", seed=1)
    graph = host.model.graph
    old = graph.output[0].name
    for i, node in enumerate(graph.node):
        node.name = f"{node_prefix}{i}"
        for slots in (node.input, node.output):
            for j, name in enumerate(slots):
                if name == old:
                    slots[j] = output
    graph.output[0].name = output
    onnx.save(host.model, tmp_path / "m.onnx")
    save_inputs(tmp_path / "in.npz", host.inputs)
    return tmp_path / "m.onnx", tmp_path / "in.npz"


def test_an_output_name_cannot_forge_the_verdict_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs = _host(tmp_path, output=FORGED)
    assert main(["compare", str(model), "--inputs", str(inputs), "--no-layerwise"]) == 1
    lines = capsys.readouterr().out.splitlines()
    # The verdict line "FAIL: divergence: outputs differ: y" was followed by "PASS: outputs match (mismatch, ...)",
    # the last line of the run.
    assert not [line for line in lines if line.startswith("PASS")], lines
    verdict = [line for line in lines if line.startswith("FAIL: ")]
    assert len(verdict) == 1 and "y\\n\\nPASS: outputs match (mismatch, 32/32 elements)" in verdict[0]


def test_a_node_name_cannot_become_a_spreadsheet_formula(tmp_path: Path) -> None:
    model, inputs = _host(tmp_path, node_prefix=FORMULA)
    table = tmp_path / "layers.csv"
    assert main(["compare", str(model), "--inputs", str(inputs), "--csv", str(table)]) == 1
    rows = list(csv.DictReader(table.open(newline="")))
    assert rows
    # Each such cell began with "=": a spreadsheet opening the file runs the formula.
    cells = [cell for row in rows for cell in row.values() if cell]
    assert not [cell for cell in cells if cell.startswith(("=", "+", "@", "\t", "\r"))]
    assert rows[0]["node"] == f"'{FORMULA}0"
    assert all(not cell.startswith("-") or _number(cell) for cell in cells)  # only numbers start with "-"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_trtexec_lines_leave_out_names_trtexec_cannot_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    overrides = PrecisionOverrides("fp16", keep_fp32=("a,b", "it's", "*", "ln:Pow", "mm"), keep_op_types=(),
                                   lowered=())
    # "a,b" split the list into "a" and "b:fp32" (another layer's pin), "*" pinned every layer, silently.
    with caplog.at_level("WARNING"):
        write_overrides(overrides, tmp_path)
    line = (tmp_path / "trtexec.txt").read_text()
    assert "--layerPrecisions=ln:Pow:fp32,mm:fp32 " in line
    assert line.endswith("--layerOutputTypes=ln:Pow:fp32,mm:fp32\n")
    assert "trtexec cannot name 3 of the 5 FP32 node(s)" in caplog.text
    written = (tmp_path / "overrides.json").read_text()
    assert '"trtexec_left_out": [\n    "a,b",\n    "it\'s",\n    "*"\n  ]' in written
    assert (tmp_path / "keep_fp32.txt").read_text().splitlines() == ["a,b", "it's", "*", "ln:Pow", "mm"]


def test_a_terminal_that_cannot_show_the_times_sign_is_no_graphbisect_bug(tmp_path: Path) -> None:
    model, inputs = _host(tmp_path)
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    done = subprocess.run([sys.executable, "-m", "graphbisect", "compare", str(model), "--inputs", str(inputs)],
                          env=env, capture_output=True, text=True, errors="replace", timeout=300, check=False)
    # "internal error: UnicodeEncodeError: 'ascii' codec can't encode character '\xd7'", exit 3
    assert done.returncode == 1, done.stderr[-2000:]
    assert "\\xd7" in done.stdout and "graphbisect bug" not in done.stderr
