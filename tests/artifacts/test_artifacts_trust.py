"""Issue 24, the trust rule: a bundle is data, never code.

A bundle is a download. Its recorded target (``report.json``) and the settings ``repro.py`` applies
(``repro_config.json``) run only when every option is known to be inert (it cannot run a program, load a
library or write a file); anything else needs ``--trust``. One test per numbered case of the issue; each
ran code or wrote files from an untrusted bundle before the rule (``graphbisect verify`` and ``repro.py``
without ``--trust``). The rule itself is tested in ``tests/backends/test_inert.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from artifacts_builders import CLIP_INPUT, LN_INPUT, build_content, layernorm_model, relu_clip_model, run_repro

from graphbisect.artifacts import BundleContent, load_bundle, write_bundle
from graphbisect.artifacts.bundle import BundleError
from graphbisect.backends import resolve
from graphbisect.cli.main import main
from graphbisect.workflows.verify import verify_bundle
from tests.cpu_premises import openvino_dynamic_quantization

iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")


@pytest.fixture(scope="module")
def ort_bundle(mismatch_content: BundleContent, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle: ONNX Runtime's LayerNormFusion bug, written by graphbisect."""
    return write_bundle(mismatch_content, tmp_path_factory.mktemp("ort") / "bug")


@pytest.fixture(scope="module")
def openvino_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle of an OpenVINO target with an inert config key: the int8-weight layer its dynamic
    quantization computes wrongly (issue 26) on a CPU with AVX2-VNNI or AVX512-VNNI; elsewhere OpenVINO
    computes it in f32 and the bundle records that the target agrees, which serves the trust rule the same."""
    pytest.importorskip("openvino")
    from graphbisect.examples.quantized import int8_weight_model

    folder = tmp_path_factory.mktemp("openvino")
    model, inputs = int8_weight_model()
    content = build_content(model, inputs, folder / "case", target="openvino:config=NUM_STREAMS=1")
    return write_bundle(content, folder / "bug")


@pytest.fixture(scope="module")
def iree_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle of an ``iree`` target (whatever it observed: only its repro.py section matters)."""
    folder = tmp_path_factory.mktemp("iree")
    content = build_content(layernorm_model(), {"x": LN_INPUT}, folder / "case", target="iree")
    return write_bundle(content, folder / "bug")


def _downloaded(bundle: Path, tmp_path: Path, *, target: str | None = None,
                edit: Callable[[dict], None] | None = None) -> Path:
    """A copy of ``bundle`` whose author rewrote the recorded target (report.json: not hashed, it is the
    index) or repro_config.json (repro.py reads it)."""
    copy = tmp_path / "downloaded"
    shutil.copytree(bundle, copy)
    if target is not None:
        report = json.loads((copy / "report.json").read_text())
        report["target"] = target
        (copy / "report.json").write_text(json.dumps(report))
    if edit is not None:
        config = json.loads((copy / "repro_config.json").read_text())
        edit(config)
        (copy / "repro_config.json").write_text(json.dumps(config))
    return copy


def _program(tmp_path: Path, marker: Path) -> Path:
    """A program the bundle's author ships: it leaves ``marker`` behind when it runs."""
    program = tmp_path / "program.sh"
    program.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    program.chmod(0o755)
    return program


# --- graphbisect verify: the recorded target ---------------------------------------------------------------
def test_case1_a_command_under_its_alias_needs_trust(ort_bundle: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # `cmd` is an alias of `command`: the check compared the spec's name before aliases were resolved.
    marker = tmp_path / "pwned"
    bundle = _downloaded(ort_bundle, tmp_path, target=f"cmd:cmd=touch {marker}; true {{model}} {{inputs}},shell=1")
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "--trust" in err and f"cmd=touch {marker}" in err and "program" in err
    main(["verify", str(bundle), "--trust"])  # read and trusted: it runs
    assert marker.exists()


@iree_installed
def test_case2_an_iree_compiler_flag_naming_a_program_needs_trust(ort_bundle: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # iree-compile runs the program named by --iree-llvmcpu-embedded-linker-path as its linker.
    marker = tmp_path / "linked"
    flag = f"--iree-llvmcpu-embedded-linker-path={_program(tmp_path, marker)}"
    bundle = _downloaded(ort_bundle, tmp_path, target=f"iree:flags={flag}")
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "--trust" in err and flag in err
    main(["verify", str(bundle), "--trust"])
    assert marker.exists()


def test_case3_an_ort_session_config_key_naming_a_file_needs_trust(ort_bundle: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # ONNX Runtime writes its node memory statistics to the file this key names (and verify said REPRODUCES).
    written = tmp_path / "elsewhere.csv"
    entry = f"session.collect_node_memory_stats_to_file={written}"
    bundle = _downloaded(ort_bundle, tmp_path, target=f"onnxruntime:config={entry},opt_level=all")
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert not written.exists()
    assert "--trust" in err and f"config={entry}" in err and "inert" in err
    assert main(["verify", str(bundle), "--trust"]) == 1
    assert written.exists()


@iree_installed
def test_case3_an_iree_dump_flag_needs_trust(ort_bundle: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # iree-compile writes every executable into the folder this flag names (and verify said FIXED).
    folder = tmp_path / "dumped"
    flag = f"--iree-hal-dump-executable-files-to={folder}"
    bundle = _downloaded(ort_bundle, tmp_path, target=f"iree:flags=--iree-opt-level=O0;{flag}")
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert not folder.exists()
    assert f"flags={flag}: is not an iree-compile flag known to be inert" in err
    assert "flags=--iree-opt-level=O0:" not in err  # the inert flag is not listed
    with load_bundle(bundle) as loaded, pytest.raises(BundleError, match="--trust"):  # the API refuses too
        verify_bundle(loaded)
    assert not folder.exists()


@pytest.mark.openvino
def test_an_openvino_config_key_writing_a_folder_needs_trust(openvino_bundle: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # OpenVINO writes compiled blobs into the folder CACHE_DIR names; NUM_STREAMS (recorded) is inert.
    cache = tmp_path / "cache"
    # verify's verdict on the bundle (1: the failure reproduces, 0: the target agrees with the oracle)
    ran = 1 if openvino_dynamic_quantization().active else 0
    assert main(["verify", str(openvino_bundle)]) == ran  # the honest one runs without --trust
    bundle = _downloaded(openvino_bundle, tmp_path, target=f"openvino:config=NUM_STREAMS=1;CACHE_DIR={cache}")
    capsys.readouterr()
    assert main(["verify", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert not cache.exists()
    assert "--trust" in err and f"config=CACHE_DIR={cache}: is not an OpenVINO property known to be inert" in err
    assert "config=NUM_STREAMS=1:" not in err  # the inert entry is not listed
    assert main(["verify", str(bundle), "--trust"]) == ran
    assert any(cache.iterdir())


@pytest.mark.openvino
def test_repro_py_refuses_an_openvino_config_key_writing_a_folder(openvino_bundle: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_repro(openvino_bundle)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr

    def edit(config: dict) -> None:
        assert config["options"]["config"] == [["NUM_STREAMS", "1"]]
        config["options"]["config"].append(["CACHE_DIR", str(cache)])

    bundle = _downloaded(openvino_bundle, tmp_path, edit=edit)
    proc = run_repro(bundle)
    assert proc.returncode == 2 and "--trust" in proc.stderr and "CACHE_DIR" in proc.stderr, proc.stdout + proc.stderr
    assert not cache.exists()
    proc = run_repro(bundle, "--trust")
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    assert any(cache.iterdir())


def test_the_honest_bundle_verifies_without_trust(ort_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(ort_bundle)]) == 1
    assert "REPRODUCES" in capsys.readouterr().out


def test_a_target_named_on_the_command_line_is_the_users_own_choice(ort_bundle: Path, tmp_path: Path) -> None:
    written = tmp_path / "stats.csv"
    target = f"onnxruntime:opt_level=all,config=session.collect_node_memory_stats_to_file={written}"
    assert main(["verify", str(ort_bundle), "--target", target]) == 1
    assert written.exists()


# --- repro.py: repro_config.json ---------------------------------------------------------------------------
def test_case3_repro_py_refuses_a_session_config_key_naming_a_file(ort_bundle: Path, tmp_path: Path) -> None:
    written = tmp_path / "elsewhere.csv"

    def edit(config: dict) -> None:
        config["options"]["session_config"].append(["session.collect_node_memory_stats_to_file", str(written)])

    bundle = _downloaded(ort_bundle, tmp_path, edit=edit)
    proc = run_repro(bundle)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not written.exists()
    assert "--trust" in proc.stderr and "session.collect_node_memory_stats_to_file" in proc.stderr
    proc = run_repro(bundle, "--trust")  # read and trusted: it runs as written
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr
    assert written.exists()


def test_repro_py_of_an_honest_bundle_runs_without_trust(ort_bundle: Path) -> None:
    proc = run_repro(ort_bundle)
    assert proc.returncode == 1 and "REPRODUCED" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(("edit", "said"), [
    (lambda c: c["options"].update(custom_ops_library="/tmp/libevil.so"), "--trust"),  # an option it does not know
    # a config of another shape is damaged, whatever --trust says (issue 36 item 7)
    (lambda c: c.update(options=["not", "a", "mapping"]), "options must be a JSON object, not a JSON list"),
    (lambda c: c.update(control={"target_spec": "onnxruntime", "options": {
        **c["options"], "session_config": [["session.debug_layout_transformation", "1"]]}}), "--trust"),
], ids=["unknown option", "not a mapping", "control"])
def test_repro_py_refuses_what_it_does_not_know_to_be_inert(edit: Callable[[dict], None], said: str,
                                                             ort_bundle: Path, tmp_path: Path) -> None:
    proc = run_repro(_downloaded(ort_bundle, tmp_path, edit=edit))
    assert proc.returncode == 2 and said in proc.stderr, proc.stdout + proc.stderr


@iree_installed
def test_case2_repro_py_refuses_an_iree_flag_naming_a_program(iree_bundle: Path, tmp_path: Path) -> None:
    marker = tmp_path / "linked"
    flag = f"--iree-llvmcpu-embedded-linker-path={_program(tmp_path, marker)}"
    bundle = _downloaded(iree_bundle, tmp_path, edit=lambda c: c["options"]["flags"].append(flag))
    proc = run_repro(bundle)
    assert proc.returncode == 2 and flag in proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists()
    run_repro(bundle, "--trust")
    assert marker.exists()


def test_case1_repro_py_of_a_command_bundle_needs_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The program is the reproduction, chosen by whoever wrote the bundle: read repro_config.json first.
    marker = tmp_path / "ran"
    script = tmp_path / "check.py"
    script.write_text(f"import pathlib, sys\npathlib.Path({str(marker)!r}).touch()\nsys.exit(1)\n")
    content = build_content(relu_clip_model(), {"x": CLIP_INPUT}, tmp_path / "case",
                            target=f"cmd:cmd={sys.executable} {script} {{model}} {{inputs}}")
    bundle = write_bundle(content, tmp_path / "bug")
    marker.unlink()  # build_content ran it
    monkeypatch.delenv("PYTHONPATH", raising=False)
    proc = run_repro(bundle)
    assert proc.returncode == 2 and "cmd" in proc.stderr and "--trust" in proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists()
    proc = run_repro(bundle, "--trust")
    assert proc.returncode == 1 and marker.exists(), proc.stdout + proc.stderr
