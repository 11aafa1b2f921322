"""What a newcomer hits first: the README's set-up commands, --example, tolerances, and the report files."""

from __future__ import annotations

import csv
import re
import shlex
import zipfile
from pathlib import Path

import onnx
import pytest

from graphbisect.artifacts.charts import LEGEND, ErrorPoint, error_chart_svg
from graphbisect.cli.common import tolerance_from_args
from graphbisect.cli.main import build_parser, main
from graphbisect.examples.patterns import pattern_model

ROOT = Path(__file__).resolve().parents[1]


def _readme_setup() -> list[str]:
    block = ROOT.joinpath("README.md").read_text().split("## Set up", 1)[1].split("```bash", 1)[1].split("```")[0]
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_installs_what_ci_installs_and_what_the_tests_need() -> None:
    """The README's install line is the one CI (.ci/run) runs before the README's test command."""
    install, test = _readme_setup()
    pip = next(part for part in install.split("&&") if "pip install" in part)
    spec = shlex.split(pip)[-1]
    assert spec == ".[cpu,dev]"
    assert 'pip install -q ".[cpu,dev]"' in ROOT.joinpath(".ci", "run").read_text()
    assert test == "python -m pytest"
    extras = ROOT.joinpath("pyproject.toml").read_text()
    assert re.search(r'^dev = \[.*"pytest', extras, re.M), "the dev extra installs pytest"


def test_gitignore_ignores_the_readme_example_output() -> None:
    assert "/bug-report/" in ROOT.joinpath(".gitignore").read_text().splitlines()


def test_precision_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`precision --example` was advertised and failed; it uses a CNN that needs FP32 on one block."""
    assert main(["precision", "--example", "--no-prefix"]) == 0
    out = capsys.readouterr().out
    assert "block3/conv1" in out and "meets the tolerance" in out


def test_example_and_a_model_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`compare MODEL --example` silently ignored MODEL."""
    model = tmp_path / "m.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), model)
    assert main(["compare", str(model), "--example"]) == 2
    assert "both a model" in capsys.readouterr().err


def test_polygraphy_style_per_output_tolerances() -> None:
    args = build_parser().parse_args(["compare", "m.onnx", "--atol", "1e-5", "--atol", "out:1e-3",
                                      "--rtol", "x:0:0"])
    tol = tolerance_from_args(args)
    assert (tol.atol, tol.rtol) == (1e-5, 1e-3)
    assert tol.for_tensor("out") == (1e-3, 1e-3)
    assert tol.for_tensor("x:0") == (1e-5, 0.0)  # TensorFlow-style names keep their ':'
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "m.onnx", "--atol", "out:abc"])


def test_per_output_tolerance_changes_the_verdict(tmp_path: Path) -> None:
    model = tmp_path / "ln.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), model)
    assert main(["compare", str(model), "--no-layerwise"]) == 1
    assert main(["compare", str(model), "--no-layerwise", "--atol", "y:100", "--rtol", "y:100"]) == 0
    assert main(["compare", str(model), "--no-layerwise", "--atol", "nosuch:1"]) == 2  # a typo is an error


def test_compare_html_header_and_csv_ranges(tmp_path: Path) -> None:
    model = tmp_path / "ln.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), model)
    main(["compare", str(model), "--html", str(tmp_path / "r.html"), "--csv", str(tmp_path / "r.csv")])
    page = (tmp_path / "r.html").read_text()
    header = page.split("<h2>", 1)[0]
    assert "{'" not in header and "'path'" not in header  # no raw Python dicts
    assert "backend runs: oracle 1, target 2" in header  # the oracle's capture is its verdict too
    rows = [row for row in csv.DictReader((tmp_path / "r.csv").open()) if row["oracle_range"]]
    assert rows
    for row in rows:
        assert re.fullmatch(r"\[-?[\d.e+-]+, -?[\d.e+-]+\]", row["oracle_range"]), row["oracle_range"]
        assert re.fullmatch(r"\d+(x\d+)*", row["oracle_shape"])


def test_chart_has_a_legend_and_labels_do_not_overlap() -> None:
    points = [ErrorPoint(i, f"block/very_long_node_name_{i}", 10.0 * (i + 1), "root" if i % 2 else "first")
              for i in range(12)]
    svg = error_chart_svg(points)
    for _color, meaning in LEGEND:
        assert meaning in svg
    labels = [(float(x), float(y)) for x, y in re.findall(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="middle" '
                                                            r'fill=', svg)]
    assert labels
    for i, (x1, y1) in enumerate(labels):
        for x2, y2 in labels[i + 1:]:
            assert y1 != y2 or abs(x1 - x2) > 6.2 * 28, "two labels on one row overlap"


def test_reduce_passes_zip_writes_the_zip(tmp_path: Path) -> None:
    model = tmp_path / "ln.onnx"
    onnx.save(pattern_model("layernorm_keepdims0"), model)
    assert main(["reduce", str(model), "--passes", "--zip", "-o", str(tmp_path / "bug")]) == 1
    with zipfile.ZipFile(tmp_path / "bug.zip") as archive:
        assert any(name.endswith("repro.py") for name in archive.namelist())


def test_the_main_job_prints_and_writes_what_the_readme_says(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The README's walk-through of `reduce --example`: each line it shows starts a line of the real output, and
    its list of the bundle's files is the folder's."""
    readme = ROOT.joinpath("README.md").read_text()
    shown = readme.split("## What the main job does", 1)[1].split("```\n", 2)[1]
    listed = readme.split("The bundle `bug-report/` holds", 1)[1].split("\n\n", 1)[0]
    assert main(["reduce", "--example", "-o", str(tmp_path / "bug-report")]) == 1
    printed = capsys.readouterr().out.splitlines()
    for line in shown.splitlines():
        if line and not line.startswith(" "):
            head = re.split(r" \(|, |; |/", line)[0]  # up to a path, a count in brackets, a list
            assert any(out.startswith(head) for out in printed), f"README shows {head!r}; it printed {printed}"
    named = set(re.findall(r"`([\w.]+\.(?:onnx|npz|py|md|json|svg))`", listed))
    assert named == {p.name for p in (tmp_path / "bug-report").iterdir()}
