"""write_bundle / load_bundle: the files, atomic replacement, refusal of foreign folders, zip."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphbisect.artifacts import BUNDLE_FORMAT, BundleContent, BundleError, is_bundle, load_bundle, write_bundle
from graphbisect.artifacts.bundle import BUNDLE_FILES
from graphbisect.backends import BackendSpec
from graphbisect.errors import ModelError, SpecError

pytest.importorskip("onnxruntime")  # every bundle here comes from real ONNX Runtime runs


def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


def test_mismatch_bundle_has_every_file(mismatch_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "bundle")
    assert out == tmp_path / "bundle"
    for name in BUNDLE_FILES:
        assert (out / name).is_file(), name
    assert (out / "journey.svg").read_text().startswith("<svg")  # drawn from report["journey"]
    assert onnx.load(out / "model.onnx").graph.node[0].op_type == "ReduceMean"
    with np.load(out / "inputs.npz") as inputs:
        np.testing.assert_array_equal(inputs["x"], mismatch_content.inputs["x"])
    with np.load(out / "target_outputs.npz") as target, np.load(out / "oracle_outputs.npz") as oracle:
        assert not np.allclose(target["y"], oracle["y"], atol=1e-4, rtol=1e-3)
    assert _siblings(out) == ["bundle"]  # no staging folder left behind


def test_report_json_holds_the_facts(mismatch_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "b")
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == BUNDLE_FORMAT
    assert report["signature"]["kind"] == "mismatch"
    assert report["oracle"] == "onnxruntime:opt_level=disable" and report["target"] == "onnxruntime:opt_level=all"
    assert report["tolerance"]["atol"] == 1e-4
    assert report["original_fingerprint"] == "f" * 64
    assert report["invocations"] == {"oracle": 3, "target": 17}  # the run's own facts are kept
    assert report["outputs"][0]["name"] == "y" and report["outputs"][0]["kind"] == "mismatch"
    assert report["model"]["nodes"] == 9
    listed = {entry["name"]: entry for entry in report["files"]}
    assert set(BUNDLE_FILES) <= set(listed)
    model_entry = listed["model.onnx"]
    assert model_entry["sha256"] == hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest()
    environment = json.loads((out / "environment.json").read_text())
    assert environment["packages"]["onnxruntime"] and environment["python"]["version"]
    import onnxruntime

    for role in ("oracle", "target"):  # what the workers measured, per role
        assert report["versions"][role]["library_version"] == onnxruntime.__version__
        assert environment["backends"][role]["library_version"] == onnxruntime.__version__
    assert environment["backends"]["target"]["spec"] == "onnxruntime:opt_level=all"


def test_report_md_reads_like_a_bug_report(mismatch_content: BundleContent, crash_content: BundleContent,
                                           tmp_path: Path) -> None:
    text = (write_bundle(mismatch_content, tmp_path / "m") / "report.md").read_text()
    assert text.startswith("# onnxruntime:opt\\_level=all: wrong values on output 'y'")
    for needle in ("## Summary", "| 1-minimal | yes", "oracle 3, target 17", "## Kept nodes",
                   "| `mean2` | ReduceMean |", "## Failure", "python repro.py", "graphbisect verify .",
                   "![journey](journey.svg)", "## Environment"):
        assert needle in text, needle
    crash = (write_bundle(crash_content, tmp_path / "c") / "report.md").read_text()
    assert "crash at load" in crash.splitlines()[0]
    assert "Unexpected data type for Clip 'min' input of 11" in crash.splitlines()[0]
    assert "```text\nFail: [ONNXRuntimeError]" in crash


def test_previous_bundle_is_replaced(mismatch_content: BundleContent, crash_content: BundleContent,
                                     tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "bundle")
    (out / "notes.txt").write_text("the user's, not the bundle's")  # issue 16: never deleted
    (out / "old_chart.svg").write_text("<svg/>")
    report = json.loads((out / "report.json").read_text())
    # a file the previous bundle wrote and the next lacks, listed as a bundle lists its files (issue 24: only
    # a file graphbisect writes into bundles, still holding the listed bytes, is removed)
    report["files"].append({"name": "old_chart.svg", "bytes": 6, "sha256": hashlib.sha256(b"<svg/>").hexdigest()})
    (out / "report.json").write_text(json.dumps(report))
    write_bundle(crash_content, out)
    assert (out / "notes.txt").read_text() == "the user's, not the bundle's"
    assert not (out / "old_chart.svg").exists()
    data = json.loads((out / "report.json").read_text())
    assert data["signature"]["kind"] == "crash-load"
    assert sorted(p.name for p in out.iterdir()) == sorted([f["name"] for f in data["files"]] + ["notes.txt"])
    assert _siblings(out) == ["bundle"]


def test_foreign_folder_is_refused_and_untouched(mismatch_content: BundleContent, tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    with pytest.raises(BundleError, match="not a graphbisect bundle") as info:
        write_bundle(mismatch_content, folder)
    assert info.value.hint
    assert [p.name for p in folder.iterdir()] == ["thesis.tex"]
    assert _siblings(folder) == ["mine"]


def test_file_destination_is_refused(mismatch_content: BundleContent, tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.write_text("x")
    with pytest.raises(BundleError, match="not a folder"):
        write_bundle(mismatch_content, target)


def test_empty_folder_and_no_failure_report_are_used(mismatch_content: BundleContent, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_bundle(write_bundle(mismatch_content, empty))
    no_failure = tmp_path / "nofail"
    no_failure.mkdir()
    (no_failure / "report.json").write_text(json.dumps({"failed": False, "original_nodes": 3}))
    assert is_bundle(write_bundle(mismatch_content, no_failure))


def test_a_failed_write_leaves_the_previous_bundle(mismatch_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "bundle")
    before = (out / "report.json").read_bytes()
    broken = dataclasses.replace(mismatch_content, report={"unserializable": object()}, charts={"x": None})  # type: ignore[dict-item]
    with pytest.raises(Exception):  # noqa: B017 (any failure while writing)
        write_bundle(broken, out)
    assert (out / "report.json").read_bytes() == before
    assert _siblings(out) == ["bundle"]


def test_zip_beside_the_folder_and_load_it(mismatch_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(mismatch_content, tmp_path / "bundle", zip=True)
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
    assert {f"bundle/{name}" for name in BUNDLE_FILES} <= names
    with load_bundle(archive) as loaded:
        extracted = loaded.path
        assert loaded.signature == mismatch_content.signature
        assert loaded.target == BackendSpec.parse("onnxruntime:opt_level=all")
        np.testing.assert_array_equal(loaded.oracle_outputs["y"], mismatch_content.oracle_outputs["y"])
        assert loaded.model_path.is_file()
    assert not extracted.exists()  # the extraction folder is removed on close
    import shutil

    shutil.rmtree(out)
    with load_bundle(tmp_path / "bundle") as loaded:  # DIR when only DIR.zip exists
        assert loaded.source == archive


def test_load_bundle_round_trip_and_errors(crash_content: BundleContent, tmp_path: Path) -> None:
    out = write_bundle(crash_content, tmp_path / "b")
    loaded = load_bundle(out)
    assert loaded.signature.kind.value == "crash-load"
    assert loaded.target_message == crash_content.target_message
    assert loaded.target_outputs == {}
    assert loaded.tolerance == crash_content.tolerance
    with pytest.raises(BundleError, match="not a bundle"):
        load_bundle(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(BundleError, match="not a graphbisect bundle"):
        load_bundle(tmp_path / "plain")


def test_paddle_target_has_no_bundle(mismatch_content: BundleContent, tmp_path: Path) -> None:
    paddle = dataclasses.replace(mismatch_content, target=BackendSpec.parse("paddle:device=cpu"))
    with pytest.raises(SpecError, match="paddle") as info:
        write_bundle(paddle, tmp_path / "bundle")
    assert info.value.hint
    assert not (tmp_path / "bundle").exists() and list(tmp_path.iterdir()) == []


def test_external_weights_are_refused(mismatch_content: BundleContent, tmp_path: Path) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(mismatch_content.model)
    onnx.external_data_helper.set_external_data(model.graph.initializer[2], location="weights.bin")
    model.graph.initializer[2].data_location = onnx.TensorProto.EXTERNAL
    with pytest.raises(ModelError, match="external-data"):
        write_bundle(dataclasses.replace(mismatch_content, model=model), tmp_path / "bundle")
