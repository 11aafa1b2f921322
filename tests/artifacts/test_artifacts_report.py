"""report.md / report.json helpers and environment.json: escaping, strict JSON, environment facts."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from artifacts_builders import HOSTILE, LN_INPUT, MISMATCH_TARGET, layernorm_model

from graphbisect.artifacts import collect_environment
from graphbisect.artifacts.environment import backend_facts, environment_summary, package_versions
from graphbisect.artifacts.report import jsonable, md_cell, md_code


def test_md_cell_neutralizes_markdown_and_html() -> None:
    cell = md_cell("a|b\n<script>*x*_y_ [l](u) `c` #h & &amp;")
    assert "|" not in cell.replace("&#124;", "") and "\n" not in cell
    assert "<" not in cell and ">" not in cell
    assert "\\*x\\*" in cell and "\\[l\\]" in cell and "\\`c\\`" in cell
    assert "& " in cell and "&amp;amp;" in cell


def test_md_code_is_verbatim() -> None:
    assert md_code("/blk10/norm/Mul_output_0") == "`/blk10/norm/Mul_output_0`"
    assert md_code("``x") == "``` ``x ```"
    assert md_code("a|b\nc", in_table=True) == "`a\\|b↵c`"
    assert md_code("a|b") == "`a|b`"


def test_jsonable_is_strict_json() -> None:
    data = jsonable({"inf": math.inf, "nan": float("nan"), "np": np.int64(3), "arr": np.arange(3),
                     "big": np.zeros(1000), "path": Path("a/b"), "set": {2, 1}, 3: (1, 2)})
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text) == {"inf": "inf", "nan": "nan", "np": 3, "arr": [0, 1, 2],
                                "big": "<array float64 [1000]>", "path": "a/b", "set": [1, 2], "3": [1, 2]}


def test_environment_facts() -> None:
    target = backend_facts("onnxruntime:python=/opt/other/bin/python",
                           {"library": "onnxruntime", "library_version": "1.20.1", "python": "/opt/other/bin/python"})
    env = collect_environment({"target": target})
    json.dumps(env, allow_nan=False)
    assert env["python"]["version"] and env["platform"]["machine"]
    assert env["packages"]["numpy"] == np.__version__
    assert env["backends"]["target"]["library_version"] == "1.20.1" and env["backends"]["target"]["measured"]
    assert "note" in env  # a backend ran under another interpreter: packages are not its versions
    assert isinstance(env["gpus"], list) and env["cpu"]["logical_cores"]
    assert env["backends"]["target"]["own_interpreter"] is False  # measured while the path said it
    rows = dict(environment_summary(env))
    assert list(rows)[:3] == ["Python", "OS", "CPU"] and "numpy (graphbisect's interpreter)" in rows
    assert rows["target ran"] == "onnxruntime 1.20.1 (Python python)"  # by name: not where it lives
    assert "target ran" not in dict(environment_summary(env, backends=False))
    here = dict(environment_summary(collect_environment()))
    assert "numpy" in here  # no backend ran elsewhere: plain labels
    assert not backend_facts("ort", None)["measured"]
    assert "not-a-distribution" not in package_versions(("numpy", "not-a-distribution"))



def test_iree_bundles_record_the_runtime_beside_the_compiler() -> None:
    """An iree worker reports iree.compiler as its library; the runtime that loaded the module is another
    distribution, and environment.json listed neither, so a compiler/runtime mismatch could not be seen."""
    pytest.importorskip("iree.runtime")
    packages = package_versions()
    assert {"iree-base-compiler", "iree-base-runtime"} <= set(packages)


def test_a_command_target_does_not_lend_it_graphbisects_versions(tmp_path: Path) -> None:
    """A ``command:`` target runs a program whose versions graphbisect cannot measure (it may run any
    onnxruntime). environment.json and report.md listed this interpreter's packages unqualified
    ("onnxruntime | 1.32.0") beside "target ran: not measured", as if they were what the target ran."""
    import onnx

    import graphbisect
    from graphbisect.examples.patterns import pattern_model

    program = tmp_path / "run_ort.py"
    program.write_text("import sys\nimport numpy as np\nimport onnxruntime as ort\n\n"
                       "model, inputs, outputs = sys.argv[1:4]\n"
                       "session = ort.InferenceSession(model, providers=['CPUExecutionProvider'])\n"
                       "values = session.run(None, dict(np.load(inputs)))\n"
                       "np.savez(outputs, **{o.name: v for o, v in zip(session.get_outputs(), values)})\n")
    onnx.save(pattern_model("layernorm_keepdims0"), tmp_path / "ln.onnx")
    result = graphbisect.reduce(tmp_path / "ln.onnx", tmp_path / "bundle", oracle="reference",
                                target=f"command:cmd={sys.executable} {program} {{model}} {{inputs}} {{outputs}}")
    assert result.failed and result.verified  # ORT's LayerNorm fusion, run by the program
    env = json.loads((tmp_path / "bundle" / "environment.json").read_text())
    assert not env["backends"]["target"]["measured"]
    assert "command" in env["note"]  # packages are graphbisect's, not (known to be) the target's
    report = (tmp_path / "bundle" / "report.md").read_text()
    assert re.search(r"\| Target \| `command:cmd=\S*python\S* run_ort\.py [^`]*` \| not measured \|", report), report
    assert str(tmp_path) not in report  # the spec shows its files by name
    assert "| onnxruntime (graphbisect's interpreter) |" in report and "| onnxruntime |" not in report


def test_public_api_is_pinned() -> None:
    from graphbisect import artifacts

    assert sorted(artifacts.__all__) == [
        "BUNDLE_FORMAT", "BundleContent", "BundleError", "ErrorPoint", "LoadedBundle", "collect_environment",
        "crash_key", "error_chart_svg", "is_bundle", "load_bundle", "render_repro", "repro_config",
        "size_journey_svg", "write_bundle",
    ]
    for name in artifacts.__all__:
        assert getattr(artifacts, name) is not None


def test_the_audit_section_keeps_hostile_names_inside_their_cells(tmp_path: Path) -> None:
    """The checker's statements and evidence name the model's tensors; in report.md's Audit table a name with
    ``|``, newlines or markup stays text inside its cell (reduce on the LayerNormFusion bug with hostile names)."""
    import graphbisect

    names = {**HOSTILE, "y": "y | <b>out</b>\n| PASS |"}  # the output: the name the evidence carries
    graphbisect.reduce(layernorm_model(names), tmp_path / "bug", inputs={names["x"]: LN_INPUT},
                       target=MISMATCH_TARGET)
    markdown = (tmp_path / "bug" / "report.md").read_text()
    section = markdown.split("## Audit", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 5 and all(line.count(" | ") == 2 and line.endswith(" |") for line in rows), rows
    assert "<b>" not in section and any("&lt;b&gt;" in row for row in rows)
