"""Issue 24, "nothing outside the output folder is touched": outputs are written only as regular files inside
the places the user named, and graphbisect never deletes a file it did not write.

Each test failed on the code before the fix; real files, devices and processes, no mocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphbisect.artifacts import BundleContent, write_bundle
from graphbisect.cli.main import main
from graphbisect.errors import ModelError
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.model import load_model

EXAMPLE = [str(example_model_path()), "--inputs", str(example_inputs_path()), "--no-layerwise"]


def _full_device(folder: Path) -> Path:
    """A character device node like /dev/full (1, 7), made in the test's own folder."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    path = folder / "full"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    return path


@pytest.mark.parametrize("option", ["--json", "--html", "--csv"])
def test_a_device_is_never_replaced_by_a_report(option: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    device = _full_device(tmp_path)
    # It ran the whole comparison, then renamed its file over the device node (as root: /dev/null, /dev/full).
    assert main(["compare", *EXAMPLE, option, str(device)]) == 2
    assert "is a character device" in capsys.readouterr().err
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_a_named_pipe_and_a_symbolic_link_are_never_replaced(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    other = tmp_path / "elsewhere.json"
    other.write_text("keep")
    link = tmp_path / "result.json"
    link.symlink_to(other)
    assert main(["compare", *EXAMPLE, "--json", str(fifo)]) == 2
    assert "is a named pipe" in capsys.readouterr().err
    assert main(["compare", *EXAMPLE, "--json", str(link)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and other.read_text() == "keep"


def test_a_folder_as_json_is_refused_when_parsed_not_after_the_run(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # It reduced for the whole run, then failed with exit 3, "internal error: IsADirectoryError".
    assert main(["reduce", "--example", "-o", str(tmp_path / "bug"), "--json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert not (tmp_path / "bug.work").exists()


@pytest.fixture()
def bundle(mismatch_content: BundleContent, tmp_path: Path) -> Path:
    return write_bundle(mismatch_content, tmp_path / "bug")


def test_json_into_the_bundle_is_refused(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (bundle / "report.json").read_bytes()
    # `verify --json BUNDLE/report.json` replaced the bundle's index with the verdict.
    assert main(["verify", str(bundle), "--json", str(bundle / "report.json")]) == 2
    assert "is inside the bundle" in capsys.readouterr().err
    assert (bundle / "report.json").read_bytes() == before
    assert main(["reduce", "--example", "-o", str(bundle), "--json", str(bundle / "result.json")]) == 2
    assert "is inside the bundle folder" in capsys.readouterr().err


def test_a_file_the_previous_report_lists_is_not_deleted_unless_graphbisect_wrote_it(
        mismatch_content: BundleContent, bundle: Path) -> None:
    notes = bundle / "NOTES.md"
    notes.write_text("my notes")
    report = json.loads((bundle / "report.json").read_text())
    # a report.json listing the user's file, exactly (a copied or edited one): the list is no proof of authorship
    report["files"].append({"name": "NOTES.md", "bytes": notes.stat().st_size,
                            "sha256": hashlib.sha256(notes.read_bytes()).hexdigest()})
    chart = bundle / "old_chart.svg"  # a chart an earlier version wrote, listed with its bytes: stale, removed
    chart.write_text("<svg/>")
    report["files"].append({"name": chart.name, "bytes": chart.stat().st_size,
                            "sha256": hashlib.sha256(chart.read_bytes()).hexdigest()})
    edited = bundle / "edited.svg"  # listed, but its bytes changed since: the user's now, kept
    edited.write_text("<svg>mine</svg>")
    report["files"].append({"name": edited.name, "bytes": 6, "sha256": hashlib.sha256(b"<svg/>").hexdigest()})
    (bundle / "report.json").write_text(json.dumps(report))
    write_bundle(mismatch_content, bundle)
    assert notes.read_text() == "my notes"  # it was deleted
    assert edited.exists() and not chart.exists()


def test_triage_refuses_a_folder_of_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.onnx").write_bytes(example_model_path().read_bytes())
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.md").write_text("my summary")
    # It triaged the folder, then replaced summary.md.
    assert main(["triage", str(models), "-o", str(out), "--no-passes", "--max-invocations", "1"]) == 2
    assert "holds files that are not an earlier triage's (summary.md)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["summary.md"] and (out / "summary.md").read_text() == "my summary"


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_precision_never_replaces_the_users_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``precision -o DIR`` overwrote the user's own overrides.json and trtexec.txt (issue 36 item 4), where
    passes, reduce and triage refuse a folder of other files; now it is refused before anything runs."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "overrides.json").write_text("my overrides")
    (out / "trtexec.txt").write_text("my flags")
    before = _listing(out)
    assert main(["precision", "--example", "-o", str(out), "--max-invocations", "5"]) == 2
    err = capsys.readouterr().err
    assert "holds files that are not an earlier `graphbisect precision`'s (overrides.json, trtexec.txt)" in err
    assert "choose a new or empty folder" in err
    assert _listing(out) == before


def test_precision_writes_nothing_into_a_reduce_bundle(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _listing(bundle)  # it added five files to the bundle (mixed_precision.onnx, snippets.py, ...)
    assert main(["precision", "--example", "-o", str(bundle), "--max-invocations", "5"]) == 2
    assert "holds files that are not an earlier `graphbisect precision`'s" in capsys.readouterr().err
    assert _listing(bundle) == before


def test_precision_replaces_its_own_earlier_output_and_keeps_other_files(tmp_path: Path) -> None:
    out = tmp_path / "fp16"
    assert main(["precision", "--example", "-o", str(out), "--max-invocations", "5"]) in (0, 1)
    assert (out / "overrides.json").is_file() and (out / ".graphbisect-precision").is_file()
    (out / "NOTES.md").write_text("mine")  # added to the marked folder: a later run keeps it
    (out / "overrides.json").write_text("stale")
    assert main(["precision", "--example", "-o", str(out), "--max-invocations", "5"]) in (0, 1)
    assert (out / "NOTES.md").read_text() == "mine" and (out / "overrides.json").read_text() != "stale"


def test_hard_linked_external_data_of_another_owner_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    secret = tmp_path / "secret.bin"  # root's file, outside the model's folder
    secret.write_bytes(np.arange(1, 5, dtype=np.float32).tobytes())
    folder = tmp_path / "planted"
    folder.mkdir()
    os.link(secret, folder / "w.bin")  # a hard link names no target: the symbolic-link check cannot see it
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])], [w])
    model = folder / "model.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    os.chown(model, 65534, 65534)  # planted by another user (nobody)
    with pytest.raises(ModelError, match="hard link to a file of another owner"):
        load_model(model)  # it loaded the secret's bytes as the weights, and a bundle carried them
    os.chown(model, 0, 0)  # the owner's own link (graphbisect's work folders hard-link the user's weights)
    assert load_model(model).proto.graph.initializer[0].name == "w"
