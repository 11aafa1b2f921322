"""Issue 36 items 5 and 8: a bundle is held to what its model declares before anything of it is read or run.

Each test failed before the fix: a deflate bomb in ``inputs.npz`` or ``oracle_outputs.npz`` was decompressed in
full by ``verify`` and ``repro.py`` and then called "DIFFERENT FAILURE ... the bug may be fixed"; a ``command``
target's outputs file the same; a zip of thousands of members was extracted member by member; external data
outside the bundle was refused by the library and called a different failure; FIFO external data was called
"missing"; a bundle of format version 999 verified silently. The bombs here are small (256 MB of zeros at
most, and only where a child process's peak memory is measured): the rule reads headers, not sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from artifacts_builders import run_repro

from graphbisect.artifacts import BundleContent, load_bundle, write_bundle
from graphbisect.artifacts.bundle import BundleError
from graphbisect.artifacts.repro import render_repro
from graphbisect.artifacts.repro_backends._common import embedded_source
from graphbisect.cli.main import main
from graphbisect.errors import ModelError
from graphbisect.model import load_model
from graphbisect.storage import npzguard
from tests.storage.test_npzguard import forged_npz, relu_model

#: A child's own peak memory (VmHWM: ru_maxrss survives exec, so it would report pytest's), printed last.
_PEAK = ("import re, sys; from graphbisect.cli.main import main; code = main(sys.argv[1:]); "
         "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(code)")


@pytest.fixture(scope="module")
def bundle(mismatch_content: BundleContent, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An honest bundle: ONNX Runtime's LayerNormFusion bug (model input x: float32 [4, 4])."""
    return write_bundle(mismatch_content, tmp_path_factory.mktemp("limits") / "bug")


def _rehashed(bundle: Path, tmp_path: Path, **replace: Path) -> Path:
    """A copy of ``bundle`` with files replaced, whose report.json lists their sha256 (as an attacker writes it)."""
    copy = tmp_path / "sent"
    shutil.copytree(bundle, copy)
    for name, source in replace.items():
        shutil.copyfile(source, copy / name.replace("_npz", ".npz").replace("_onnx", ".onnx"))
    report = json.loads((copy / "report.json").read_text())
    for entry in report["files"]:
        if "sha256" in entry:
            data = (copy / entry["name"]).read_bytes()
            entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (copy / "report.json").write_text(json.dumps(report))
    return copy


def test_verify_refuses_an_inputs_bomb_before_decompressing_it(bundle: Path, tmp_path: Path) -> None:
    """256 MB of zeros declared (4, 2^24) for the [4, 4] input: decompressed in full (2.16 GB at 2^29), run, and
    called "DIFFERENT FAILURE ... the bug may be fixed" (exit 1)."""
    bomb = forged_npz(tmp_path / "bomb.npz", "x", (4, 1 << 24))
    assert bomb.stat().st_size < 1_000_000
    sent = _rehashed(bundle, tmp_path, inputs_npz=bomb)
    done = subprocess.run([sys.executable, "-c", _PEAK, "verify", str(sent)], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unsafe bundle" in done.stderr and "declares float32 (4, 16777216) (256.0 MB), but the model declares " \
        "'x' as [4, 4] (refused before decompressing it)" in done.stderr, done.stderr
    assert "DIFFERENT" not in done.stdout
    assert int(done.stdout.split()[-1]) < 160_000, done.stdout  # KiB: the bomb alone is 256 MB


def test_an_oracle_outputs_bomb_makes_the_bundle_unsafe(bundle: Path, tmp_path: Path) -> None:
    """The model declares output y without a shape: shape inference from the static input gives [4, 4]."""
    bomb = forged_npz(tmp_path / "bomb.npz", "y", (1 << 22,))
    with pytest.raises(BundleError, match=r"unsafe bundle .*'y.npy' declares float32 \(4194304,\) \(16.0 MB\), but "
                                          r"the model declares 'y' as \[4, 4\]"):
        load_bundle(_rehashed(bundle, tmp_path / "y", oracle_outputs_npz=bomb))
    other = forged_npz(tmp_path / "other.npz", "z", (1 << 20,))  # no output z
    with pytest.raises(BundleError, match=r"unsafe bundle .*'z.npy' declares float32 \(1048576,\) .*declares no "
                                          r"value named 'z'"):
        load_bundle(_rehashed(bundle, tmp_path / "z", oracle_outputs_npz=other))


def test_repro_py_refuses_an_inputs_bomb(bundle: Path, tmp_path: Path) -> None:
    """repro.py decompressed it in full too, then said "A DIFFERENT FAILURE" (exit 1)."""
    sent = _rehashed(bundle, tmp_path, inputs_npz=forged_npz(tmp_path / "bomb.npz", "x", (4, 1 << 20)))
    done = run_repro(sent)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "inputs.npz: member 'x.npy' declares float32 (4, 1048576) (16.0 MB), but the model declares 'x' as " \
        "[4, 4] (refused before decompressing it). This bundle is unsafe" in done.stderr, done.stderr
    assert "DIFFERENT" not in done.stdout


def test_repro_py_carries_the_rule_verbatim(mismatch_content: BundleContent) -> None:
    script = render_repro(mismatch_content)
    assert embedded_source(npzguard) in script and "def npz_refusal(" in script


def test_a_command_targets_outputs_bomb_is_not_decompressed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Output y declared [1, 4]; the program writes (1, 2^22) float32 deflated: read in full (2.13 GB at 2^29)."""
    model = relu_model(tmp_path, [1, 4])
    program = tmp_path / "program.py"
    program.write_text("import sys, zipfile\nimport numpy as np\n"
                       "with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as zf, \\\n"
                       "        zf.open('y.npy', 'w') as m:\n"
                       "    np.lib.format.write_array_header_1_0(m, {'descr': '<f4', 'fortran_order': False, "
                       "'shape': (1, 1 << 22)})\n"
                       "    m.write(bytes(4 << 22))\n")
    monkeypatch.chdir(tmp_path)
    code = main(["compare", str(model), "--target", f"command:cmd={sys.executable} {program} {{outputs}}",
                 "--no-layerwise"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "command wrote an outputs file graphbisect does not read" in out
    assert "member 'y.npy' declares float32 (1, 4194304) (16.0 MB), but the model declares 'y' as [1, 4]" in out


def test_a_zip_of_too_many_members_is_refused_before_extracting(bundle: Path, tmp_path: Path) -> None:
    """Every member was extracted (100,000 empty ones: 117 s); only bytes were capped."""
    archive = tmp_path / "bug.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for file in bundle.iterdir():
            zf.write(file, f"bug/{file.name}")
        for index in range(1001):
            zf.writestr(f"bug/pad/{index}", b"")
    with pytest.raises(BundleError, match="holds more than 1000 members; a bundle is a dozen files"):
        load_bundle(archive)


def _external(bundle: Path, tmp_path: Path, location: str) -> Path:
    """The bundle with its initializer ``two`` moved to external data at ``location``."""
    model = onnx.load(str(bundle / "model.onnx"))
    (two,) = [t for t in model.graph.initializer if t.name == "two"]
    two.ClearField("raw_data")
    del two.float_data[:]
    two.data_location = onnx.TensorProto.EXTERNAL
    two.external_data.add(key="location", value=location)
    forged = tmp_path / "model.onnx"
    onnx.save(model, forged)
    return _rehashed(bundle, tmp_path, model_onnx=forged)


def test_external_data_outside_the_bundle_makes_it_unsafe(bundle: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every library refused it, and verify called that "DIFFERENT FAILURE ... the bug may be fixed" (exit 1)."""
    (tmp_path / "secret.bin").write_bytes(np.float32(2.0).tobytes())
    sent = _external(bundle, tmp_path, "../secret.bin")
    assert main(["verify", str(sent)]) == 2
    err = capsys.readouterr().err
    assert f"unsafe bundle {sent}" in err and "outside the model's folder (location '../secret.bin')" in err, err
    assert "do not run it: ask its sender for the bundle again" in err


def test_fifo_external_data_is_named_for_what_it_is(bundle: Path, tmp_path: Path) -> None:
    sent = _external(bundle, tmp_path, "two.bin")
    os.mkfifo(sent / "two.bin")
    with pytest.raises(BundleError, match=r"unsafe bundle .* from 'two.bin', which is a named pipe, not a file"):
        load_bundle(sent)
    (sent / "two.bin").unlink()
    (sent / "two.bin").mkdir()
    with pytest.raises(BundleError, match="which is a folder, not a file"):
        load_bundle(sent)


def test_fifo_external_data_of_a_model_is_named_for_what_it_is(tmp_path: Path) -> None:
    """load_model called a named pipe, a device or a folder "missing"."""
    path = relu_model(tmp_path, [1, 4])
    model = onnx.load(str(path))
    weight = onnx.numpy_helper.from_array(np.zeros(4, np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="w.bin")
    model.graph.initializer.append(weight)
    onnx.save(model, path)
    os.mkfifo(tmp_path / "w.bin")
    with pytest.raises(ModelError, match=re.escape("(location 'w.bin') is a named pipe, not a file")):
        load_model(path)
    (tmp_path / "w.bin").unlink()
    (tmp_path / "w.bin").mkdir()
    with pytest.raises(ModelError, match="is a folder, not a file"):
        load_model(path)


def test_a_newer_format_version_is_refused_saying_to_upgrade(bundle: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    sent = _rehashed(bundle, tmp_path)
    report = json.loads((sent / "report.json").read_text())
    report["format_version"] = 999
    (sent / "report.json").write_text(json.dumps(report))
    assert main(["verify", str(sent)]) == 2
    err = capsys.readouterr().err
    assert "has format version 999, newer than this graphbisect" in err and "upgrade graphbisect" in err, err
