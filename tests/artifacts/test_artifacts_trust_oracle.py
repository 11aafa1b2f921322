"""Issue 36 item 1, the trust rule for every recorded spec: the oracle is data too.

``graphbisect verify BUNDLE --model ORIGINAL`` (and ``graphbisect.verify(..., model=...)``) re-checks the
user's model on the bundle's oracle, and it ran the oracle ``report.json`` records without ``--trust``, even
with ``--target``: a ``cmd:`` oracle ran its program, ``onnxruntime:python=evil.sh`` ran ``evil.sh``, a
session config key wrote a file. Every spec a bundle supplies now goes through one check
(:func:`graphbisect.workflows.verify.require_trust`) before it runs; a spec the caller names (``--target``,
``--oracle``) is the caller's own choice. ``repro.py`` never runs the oracle (it reads
``oracle_outputs.npz``), whatever the bundle records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from artifacts_builders import FIXED_TARGET, ORACLE, layernorm_model, run_repro

import graphbisect as gb
from graphbisect.artifacts import BundleContent, load_bundle, write_bundle
from graphbisect.artifacts.bundle import BundleError
from graphbisect.cli.main import main
from graphbisect.workflows.verify import recheck_original, require_trust, verify_bundle


@pytest.fixture(scope="module")
def ort_bundle(mismatch_content: BundleContent, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle: ONNX Runtime's LayerNormFusion bug, written by graphbisect."""
    return write_bundle(mismatch_content, tmp_path_factory.mktemp("ort") / "bug")


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model the bundle was reduced from (here: the same graph)."""
    path = tmp_path_factory.mktemp("original") / "original.onnx"
    onnx.save(layernorm_model(), path)
    return path


def _with_oracle(bundle: Path, tmp_path: Path, oracle: str) -> Path:
    """A copy of ``bundle`` whose author rewrote the recorded oracle (report.json is the index: not hashed)."""
    copy = tmp_path / "downloaded"
    shutil.copytree(bundle, copy)
    report = json.loads((copy / "report.json").read_text())
    report["oracle"] = oracle
    (copy / "report.json").write_text(json.dumps(report))
    return copy


def _script(tmp_path: Path, marker: Path) -> Path:
    """A program the bundle's author ships: it leaves ``marker`` behind when it runs."""
    program = tmp_path / "evil.sh"
    program.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    program.chmod(0o755)
    return program


#: The three oracles of the issue, by what they would leave behind: (spec, what its option is, expected text).
ORACLES = {
    "command": lambda tmp, marker: (f"cmd:cmd=touch {marker}; true {{model}} {{inputs}},shell=1",
                                    f"cmd=touch {marker}"),
    "python": lambda tmp, marker: (f"onnxruntime:python={_script(tmp, marker)}", f"python={tmp / 'evil.sh'}"),
    "config": lambda tmp, marker: (f"onnxruntime:opt_level=disable,"
                                   f"config=session.collect_node_memory_stats_to_file={marker}",
                                   f"config=session.collect_node_memory_stats_to_file={marker}"),
}


@pytest.mark.parametrize("case", [(kind, named) for named in (False, True) for kind in ORACLES],
                         ids=lambda case: f"{case[0]}-{'--target' if case[1] else 'recorded target'}")
def test_verify_model_refuses_an_untrusted_recorded_oracle(case: tuple[str, bool], ort_bundle: Path, original: Path,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kind, named_target = case
    marker = tmp_path / "ran"
    oracle, option = ORACLES[kind](tmp_path, marker)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    target = ["--target", FIXED_TARGET] if named_target else []
    assert main(["verify", str(bundle), "--model", str(original), *target]) == 2
    out, err = capsys.readouterr()
    assert not marker.exists()
    assert "recorded oracle" in err and option in err, err
    assert "--trust" in err and "--oracle SPEC" in err, err
    assert "REPRODUCES" not in out and "FIXED" not in out  # refused before anything ran


def test_the_api_refuses_an_untrusted_recorded_oracle(ort_bundle: Path, original: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    oracle, option = ORACLES["python"](tmp_path, marker)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    with pytest.raises(BundleError, match="recorded oracle") as refused:
        gb.verify(bundle, model=original)
    assert option in str(refused.value) and "--trust" in str(refused.value.hint)
    with pytest.raises(BundleError, match="recorded oracle"):
        gb.verify(bundle, target=FIXED_TARGET, model=original)  # a named target does not vouch for the oracle
    with load_bundle(bundle) as loaded:  # the workflow function refuses on its own too
        verification = verify_bundle(loaded, FIXED_TARGET)
        with pytest.raises(BundleError, match="recorded oracle"):
            recheck_original(verification, loaded, original)
    assert not marker.exists()


def test_trust_runs_the_recorded_oracle(ort_bundle: Path, original: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    written = tmp_path / "stats.csv"
    oracle, option = ORACLES["config"](tmp_path, written)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    assert main(["verify", str(bundle), "--model", str(original), "--trust"]) == 1  # read and trusted: it runs
    out, err = capsys.readouterr()
    assert written.exists()
    assert f"--trust: running the recorded oracle's {option}" in err, err
    assert "STILL FAILS" in out


def test_an_oracle_named_on_the_command_line_replaces_the_recorded_one(ort_bundle: Path, original: Path,
                                                                      tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    oracle, _ = ORACLES["command"](tmp_path, marker)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    assert main(["verify", str(bundle), "--model", str(original), "--oracle", ORACLE,
                 "--json", str(tmp_path / "v.json")]) == 1
    out = capsys.readouterr().out
    assert not marker.exists()
    assert f"runs {ORACLE} (--oracle)" in out and "STILL FAILS" in out, out
    assert json.loads((tmp_path / "v.json").read_text())["original"]["oracle"] == ORACLE


def test_oracle_needs_model(ort_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(ort_bundle), "--oracle", ORACLE]) == 2
    assert "--model" in capsys.readouterr().err


def test_an_untrusted_recorded_oracle_that_does_not_run_needs_no_trust(ort_bundle: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Without --model the oracle's recorded outputs are compared: nothing of it runs, and the label says so.
    marker = tmp_path / "ran"
    oracle, _ = ORACLES["command"](tmp_path, marker)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    assert main(["verify", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "REPRODUCES" in out and "(its recorded outputs; not run)" in out, out
    assert not marker.exists()


def test_an_inert_recorded_oracle_rechecks_the_model_without_trust(ort_bundle: Path, original: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(ort_bundle), "--model", str(original)]) == 1
    out = capsys.readouterr().out
    assert "REPRODUCES" in out and "STILL FAILS" in out, out
    assert f"runs on {original}" in out, out
    assert gb.verify(ort_bundle, target=FIXED_TARGET, model=original).original["failed"] is False  # type: ignore[index]


def test_one_check_names_every_recorded_spec_that_would_run(ort_bundle: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    oracle, option = ORACLES["python"](tmp_path, marker)
    copy = _with_oracle(ort_bundle, tmp_path, oracle)
    report = json.loads((copy / "report.json").read_text())
    report["target"] = "cmd:cmd=true {model} {inputs}"
    (copy / "report.json").write_text(json.dumps(report))
    with load_bundle(copy) as loaded:
        with pytest.raises(BundleError) as refused:
            require_trust(loaded, ("target", "oracle"))
        text = str(refused.value)
        assert "recorded target" in text and "recorded oracle" in text and option in text
        assert "cmd=true {model} {inputs}" in text
        assert require_trust(loaded, ()) == {}  # nothing recorded runs: nothing to refuse
        trusted = require_trust(loaded, ("oracle",), trust=True)  # trusted: what will run, for the warning
        assert [u.option for u in trusted["oracle"]] == ["python"]


def test_repro_py_never_runs_the_recorded_oracle(ort_bundle: Path, tmp_path: Path) -> None:
    # repro.py compares with oracle_outputs.npz: the oracle spec it records is a label, whatever it names.
    marker = tmp_path / "ran"
    oracle, _ = ORACLES["command"](tmp_path, marker)
    bundle = _with_oracle(ort_bundle, tmp_path, oracle)
    config = json.loads((bundle / "repro_config.json").read_text())
    config["oracle_spec"] = oracle
    (bundle / "repro_config.json").write_text(json.dumps(config))
    proc = run_repro(bundle)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists()
