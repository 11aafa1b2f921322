"""Issue 36 item 7: a malformed bundle exits 2 naming what is wrong, never 3 ("a graphbisect bug") and, for
``repro.py``, never 1 ("reproduces"). Real bundles of real ONNX Runtime runs, edited the way a hand or a
broken tool would; each case failed before the fix (exit 3, or a traceback and exit 1)."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from artifacts_builders import run_repro

from graphbisect.artifacts import BundleContent, write_bundle
from graphbisect.artifacts.report_schema import report_problem
from graphbisect.cli.main import main

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def bundle(mismatch_content: BundleContent, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bundle(mismatch_content, tmp_path_factory.mktemp("honest") / "bundle")


def _edited(bundle: Path, folder: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    copy = folder / "edited"
    shutil.copytree(bundle, copy)
    report = json.loads((copy / "report.json").read_text())
    replaced = edit(report)
    (copy / "report.json").write_text(replaced if isinstance(replaced, str) else json.dumps(report))
    return copy


# (case, edit, what the message names); report.json is not hashed: anyone can edit it
EDITS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("target as an object", lambda r: r.__setitem__("target", {"name": "onnxruntime"}), "report.json target: "),
    ("oracle as a list", lambda r: r.__setitem__("oracle", ["onnxruntime"]), "report.json oracle: "),
    ("signature as a string", lambda r: r.__setitem__("signature", "crash"), "report.json signature: "),
    ("garbage noise_floor", lambda r: r.__setitem__("noise_floor", "garbage"), "report.json noise_floor: "),
    ("noise_floor of other types", lambda r: r.__setitem__("noise_floor", {"spec": 5, "scores": [1]}),
     "report.json noise_floor.spec: "),
    ("identity as a string", lambda r: r.__setitem__("identity", "x"), "report.json identity: "),
    ("target_message as an object", lambda r: r.__setitem__("target_message", {}), "report.json target_message: "),
    ("NaN tolerance", lambda r: r["tolerance"].__setitem__("atol", float("nan")), "report.json tolerance.atol: "),
    ("nested 200,000 deep", lambda r: '{"format": "graphbisect-bundle", "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
     "nested too deeply"),
]


@pytest.mark.parametrize("case", EDITS, ids=[case for case, _, _ in EDITS])
def test_a_malformed_report_json_is_a_damaged_bundle(case: tuple[str, Callable[[dict[str, Any]], Any], str],
                                                     bundle: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, edit, named = case
    edited = _edited(bundle, tmp_path, edit)
    # each was an AttributeError / TypeError / RecursionError deep in a reader: "internal error", exit 3
    assert main(["verify", str(edited)]) == 2
    err = capsys.readouterr().err
    assert named in err and "graphbisect bug" not in err, err
    assert "is damaged" in err


def test_audit_refuses_a_malformed_report_json_before_running(bundle: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    edited = _edited(bundle, tmp_path, lambda r: r.__setitem__("signature", "crash"))
    assert main(["audit", str(edited)]) == 2
    err = capsys.readouterr().err
    assert "report.json signature: expected an object, found a string" in err and "graphbisect bug" not in err


def test_honest_bundles_have_the_shape_their_readers_rely_on(mismatch_content: BundleContent,
                                                            crash_content: BundleContent,
                                                            hostile_content: BundleContent, tmp_path: Path) -> None:
    for i, content in enumerate((mismatch_content, crash_content, hostile_content)):
        folder = write_bundle(content, tmp_path / f"b{i}")
        assert report_problem(json.loads((folder / "report.json").read_text())) is None


def _zip_with(bundle: Path, path: Path, *, flag: int = 0, method: int | None = None) -> Path:
    """The bundle zipped, with model.onnx's local and central headers marked ``flag`` / ``method``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(bundle.iterdir()):
            zf.write(file, f"bundle/{file.name}")
    data = bytearray(path.read_bytes())
    for signature, flag_at, name_len_at, name_at in ((b"PK\x03\x04", 6, 26, 30), (b"PK\x01\x02", 8, 28, 46)):
        at = data.find(signature)
        while at >= 0:
            length = struct.unpack_from("<H", data, at + name_len_at)[0]
            if bytes(data[at + name_at:at + name_at + length]) == b"bundle/model.onnx":
                struct.pack_into("<H", data, at + flag_at, struct.unpack_from("<H", data, at + flag_at)[0] | flag)
                if method is not None:
                    struct.pack_into("<H", data, at + flag_at + 2, method)
            at = data.find(signature, at + 4)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("case", [(1, None, "is encrypted"), (0, 93, "is compressed with method 93")],
                         ids=["encrypted", "zstandard"])
def test_a_zip_member_zipfile_cannot_extract_exits_2(case: tuple[int, int | None, str], bundle: Path,
                                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flag, method, said = case
    archive = _zip_with(bundle, tmp_path / "b.zip", flag=flag, method=method)
    # RuntimeError ("password required") and NotImplementedError: "internal error", exit 3
    assert main(["verify", str(archive)]) == 2
    err = capsys.readouterr().err
    assert f"member 'bundle/model.onnx' {said}" in err and "graphbisect bug" not in err, err


@pytest.mark.parametrize("timeout", [1e308, "abc", None])
def test_repro_py_exits_2_on_a_timeout_it_cannot_use(timeout: object, bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    config = json.loads((copy / "repro_config.json").read_text())
    config["timeout_seconds"] = timeout
    (copy / "repro_config.json").write_text(json.dumps(config))
    done = run_repro(copy)
    # a traceback (OverflowError, TypeError) and exit 1: "the failure reproduces"
    assert done.returncode == 2, done.stdout + done.stderr
    assert "repro_config.json: timeout_seconds must be a number of seconds" in done.stderr
    assert "Traceback" not in done.stderr


def test_repro_py_exits_2_on_a_config_of_another_shape(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    config = json.loads((copy / "repro_config.json").read_text())
    config["expect"] = "mismatch"
    (copy / "repro_config.json").write_text(json.dumps(config))
    done = run_repro(copy)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "repro_config.json: expect must be a JSON object, not a JSON string" in done.stderr
