"""What a bundle's report says (issue 25, item 6): each fact once, in one form, and nothing about where the
reporter keeps their files. Real reductions of the bundled example on ONNX Runtime, through the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.examples import example_model_path


@pytest.fixture(scope="module")
def example_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``graphbisect reduce --example -o <absolute folder>``, run from that folder's parent (the command line
    the bundle records is this one, not pytest's)."""
    here = tmp_path_factory.mktemp("reporter")
    out = here / "bug"
    argv = ["graphbisect", "reduce", "--example", "-o", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(here)
        patch.setattr(sys, "argv", argv)
        assert main(argv[1:]) == 1
    return out


def _reports(bundle: Path) -> dict[str, str]:
    return {name: (bundle / name).read_text() for name in ("report.md", "report.json", "environment.json")}


def test_a_bundle_does_not_say_where_the_reporters_files_live(example_bundle: Path) -> None:
    """report.md named the venv's interpreter, the model's folder and the -o folder by their absolute paths
    (so did report.json and environment.json); the versions a maintainer needs stay."""
    local = {"interpreter": str(Path(sys.executable).parent), "venv": sys.prefix,
             "model": str(example_model_path().parent), "bundle": str(example_bundle.parent)}
    for name, text in _reports(example_bundle).items():
        for what, path in local.items():
            assert path not in text, f"{name} says where the {what} lives: {path}"
    report = json.loads((example_bundle / "report.json").read_text())
    assert report["original_model"]["path"] == example_model_path().name
    assert report["command_line"] == "graphbisect reduce --example -o bug"  # relative to where it ran
    env = json.loads((example_bundle / "environment.json").read_text())
    target = env["backends"]["target"]
    assert target["library_version"] == env["packages"]["onnxruntime"] and target["own_interpreter"]
    assert target["library_path"] == "site-packages/onnxruntime" and target["python"] == Path(sys.executable).name
    markdown = (example_bundle / "report.md").read_text()
    assert f"onnxruntime {target['library_version']} (Python " in markdown


def test_each_fact_once_in_one_form(example_bundle: Path) -> None:
    markdown = (example_bundle / "report.md").read_text()
    # the example's metadata: in the reduced model's text, not again in the compiled model's
    assert markdown.count("graphbisect.ground\\_truth") + markdown.count("graphbisect.ground_truth") == 1
    compiled = markdown.split("## The target's compiled model", 1)[1].split("\n## ", 1)[0]
    assert 'opset_import: ["" : 17]' in compiled and "com.microsoft" not in compiled  # 9 domains, 1 used
    # every backend run in one row, each count with what it was for
    rows = [line for line in markdown.splitlines() if line.startswith("| Backend invocations")]
    assert len(rows) == 1 and "this report's facts" not in markdown, rows
    calls = r"\d+ \(\d+ compiles?\)"  # each role's runs, and what they compiled
    assert re.search(rf"oracle {calls}, target {calls} for the reduction; reference {calls}, target {calls}, "
                     rf"audit target {calls}, audit reference {calls}, audit oracle {calls} for measuring the "
                     r"sections below \|$", rows[0]), rows[0]
    # the failure's magnitude one way: the title as the Failure and Identity rows say it
    title = markdown.splitlines()[0]
    magnitudes = {re.search(r"~1e(\d+)× tolerance", line).group(1)  # type: ignore[union-attr]
                  for line in markdown.splitlines() if line.startswith(("# ", "| Failure", "| Identity"))}
    assert magnitudes == {"4"} and "e+0" not in title, title  # 7,393×: the nearest power of ten
    # the roles' versions in the backends table, not again under the environment
    assert "| target ran |" not in markdown and "| oracle ran |" not in markdown


def test_reduce_passes_bundles_the_shortest_spec_that_was_measured(tmp_path: Path) -> None:
    """After ``reduce --passes`` the report showed a ~2,000-character target spec (every registered pass but
    the culprit disabled) where the user's ``opt_level=all`` reproduces on the reduced model. The short forms
    are tried on the reduced model, and the report says which was verified."""
    out = tmp_path / "bug"
    assert main(["reduce", "--example", "--passes", "-o", str(out)]) == 1
    report = json.loads((out / "report.json").read_text())
    facts = report["passes"]
    assert len(facts["culprit_target"]) > 1000  # what the reduction ran under, kept in report.json
    assert report["target"] == "onnxruntime:opt_level=all" == facts["bundle_target"]
    control = facts["bundle_control"]
    assert control == facts["fixed_target"] and len(control) < 100  # the workaround: the culprits disabled
    assert facts["measured_specs"] == [
        {"role": "target", "spec": "onnxruntime:opt_level=all", "outcome": "reproduces"},
        {"role": "control", "spec": facts["fixed_target"], "outcome": "passes"}]
    markdown = (out / "report.md").read_text()
    assert max(len(line) for line in markdown.splitlines()) < 1000 and facts["culprit_target"] not in markdown
    assert "- target `onnxruntime:opt_level=all`: fails the same way (identity included" in markdown
    assert f"- control `{facts['fixed_target']}`: passes — the bundle's control" in markdown
    config = json.loads((out / "repro_config.json").read_text())
    assert config["target_spec"] == "onnxruntime:opt_level=all" and config["control"]["target_spec"] == control
    proc = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout and "CONTROL PASSES" in proc.stdout, proc.stdout


def test_a_resumed_reduction_keeps_the_journey_before_the_stop(tmp_path: Path) -> None:
    """The journey of a reduction resumed with ``--resume`` began at its own first step: the steps made before
    the stop (which the journal replays) were gone, as if the resumed session had found everything."""
    out = tmp_path / "bug"
    assert main(["reduce", "--example", "--no-layerwise", "--max-invocations", "12", "-o", str(out)]) == 1
    stopped = json.loads((out / "report.json").read_text())
    assert stopped["stop_reason"] == "max_invocations" and len(stopped["journey"]) >= 2
    assert stopped["journey"][-1][1] == stopped["final_nodes"]  # the best so far is the bundle's model
    assert main(["reduce", "--resume", str(out)]) == 1
    resumed = json.loads((out / "report.json").read_text())
    assert resumed["one_minimal"] and resumed["journey"][: len(stopped["journey"])] == stopped["journey"]
    assert resumed["journey"][-1][1] == resumed["final_nodes"] < stopped["final_nodes"]
    runs = [x for x, _ in resumed["journey"]]
    assert runs == sorted(runs) and runs[-1] <= resumed["search"]["tests"]
