"""Issue 24: exit 2, with what to do, for every error the input, the arguments or the machine cause (before the
run where it can be known before); exit 3 only for a real internal error.

Each test failed on the code before the fix (exit 3, "a graphbisect bug", or an error after the whole run).
Real files, processes and file systems (a small tmpfs), no mocks.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.cli.main import main
from graphbisect.examples.bundled import example_inputs_path, example_model_path

EXAMPLE = [str(example_model_path()), "--inputs", str(example_inputs_path()), "--no-layerwise"]


def _relu(folder: Path, dims: list[int | str]) -> Path:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [vi("x", TensorProto.FLOAT, dims)], [vi("y", TensorProto.FLOAT, dims)])
    path = folder / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@contextlib.contextmanager
def _small_file_system(folder: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``folder`` (root only; the test is skipped elsewhere)."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_huge_declared_input_is_refused_before_it_is_drawn(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu(tmp_path, [1000000, 1000000])
    # numpy raised MemoryError drawing 8 TB of random values: "internal error", exit 3.
    assert main(["compare", str(model), "--no-layerwise"]) == 2
    err = capsys.readouterr().err
    assert "random inputs of these shapes need" in err and "--shape" in err and "graphbisect bug" not in err


def test_a_huge_shape_argument_is_refused_before_it_is_drawn(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu(tmp_path, ["n"])
    assert main(["compare", str(model), "--no-layerwise", "--shape", "x:20000000000"]) == 2
    assert "random inputs of these shapes need" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["onnxruntime:timeout=1e308", "onnxruntime:threads=99999999999"])
def test_out_of_range_spec_options_are_usage_errors_when_parsed(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    # timeout=1e308 overflowed the platform's timer (exit 3); threads=99999999999 was the target's "crash".
    assert main(["compare", *EXAMPLE, "--target", spec]) == 2
    assert "error: argument --target" in capsys.readouterr().err


def test_zip_onto_a_folder_is_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bug.zip").mkdir()
    # It reduced for the whole run, then "internal error: IsADirectoryError".
    assert main(["reduce", *EXAMPLE, "-o", str(tmp_path / "bug"), "--zip"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert not (tmp_path / "bug.work").exists()


def test_a_full_disk_is_the_machines_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _small_file_system(tmp_path / "small", "64k") as small:
        (small / "filler").write_bytes(b"\0" * 60_000)
        # compare's --workdir on a full file system: ENOSPC writing model.onnx was "internal error", exit 3
        assert main(["compare", *EXAMPLE, "--workdir", str(small / "work")]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "hint: free space" in err and "graphbisect bug" not in err


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from graphbisect.artifacts import write_bundle

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifacts"))
    from artifacts_builders import LN_INPUT, build_content, layernorm_model

    folder = tmp_path_factory.mktemp("bundle")
    content = build_content(layernorm_model(), {"x": LN_INPUT}, folder / "build", target="onnxruntime:opt_level=all")
    return write_bundle(content, folder / "bug")


def test_a_zip_larger_than_the_free_space_is_refused_before_extracting(bundle: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "bug.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in bundle.iterdir():
            zf.write(path, f"bug/{path.name}")
        zf.writestr("bug/padding.bin", b"\0" * 200_000_000)  # 200 MB, ~200 KB compressed
    with _small_file_system(tmp_path / "tmp") as small:
        monkeypatch.setenv("TMPDIR", str(small))
        import tempfile
        monkeypatch.setattr(tempfile, "tempdir", None)  # the CLI in this process reads TMPDIR again
        assert main(["verify", str(archive)]) == 2
    err = capsys.readouterr().err
    assert "more than the" in err and "TMPDIR" in err


def test_a_bundle_whose_file_list_was_deleted_is_damaged(bundle: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "bug"
    shutil.copytree(bundle, copy)
    model = onnx.load(copy / "model.onnx")
    model.graph.node[0].op_type = "Abs"  # edited, and the hashes that would tell removed
    onnx.save(model, copy / "model.onnx")
    report = json.loads((copy / "report.json").read_text())
    del report["files"]
    (copy / "report.json").write_text(json.dumps(report))
    # It was taken as a bundle of an old version and ran the edited model without a word.
    assert main(["verify", str(copy)]) == 2
    assert "is damaged: its report.json records no sha256 of model.onnx" in capsys.readouterr().err


def _write_npz_bomb(path: Path, name: str, count: int) -> int:
    """An .npz whose member ``name`` is a float32 array of ``count`` zeros (``4 * count`` bytes, ~1/1000 of that
    deflated), as ``zipfile`` writes it with ZIP_DEFLATED and zip64 sizes; returns the member's size. Written
    without compressing gigabytes: after a full flush deflate starts afresh, so every 16 MiB of zeros deflates
    to the same bytes, compressed once and repeated (zipfile took ~8 s of CPU to deflate them all)."""
    buffer = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(np.zeros(4, np.float32))
    header["shape"] = (count,)
    np.lib.format.write_array_header_1_0(buffer, header)
    head, chunk = buffer.getvalue(), b"\0" * (1 << 24)
    chunks, rest = divmod(4 * count, len(chunk))
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, zipfile's default level
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    stream = b"".join([deflate.compress(head), deflate.flush(zlib.Z_FULL_FLUSH), block * chunks,
                       deflate.compress(chunk[:rest]), deflate.flush()])
    crc = zlib.crc32(chunk[:rest], functools.reduce(lambda c, _: zlib.crc32(chunk, c), range(chunks),
                                                    zlib.crc32(head)))
    size, raw = len(head) + 4 * count, name.encode()
    fields = (8, 0, 0x21, crc, len(stream), 0xFFFFFFFF, len(raw))  # deflate, 1980-01-01, size in zip64 extra
    zip64 = struct.pack("<HHQ", 1, 8, size)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, *fields, len(zip64)) + raw + zip64
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, *fields, len(zip64), 0, 0, 0, 0, 0)
    directory = central + raw + zip64
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(directory), len(local) + len(stream), 0)
    path.write_bytes(local + stream + directory + end)
    return size


def test_an_npz_bomb_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    model = _relu(tmp_path, [4])
    bomb = tmp_path / "bomb.npz"
    size = _write_npz_bomb(bomb, "x.npy", 500_000_000)  # 2 GB of zeros, ~2 MB compressed
    assert bomb.stat().st_size < 4_000_000
    assert zipfile.ZipFile(bomb).getinfo("x.npy").file_size == size > 2_000_000_000  # what a reader is told
    # The child's own peak (VmHWM, this process image's): ru_maxrss survives exec, so a child spawned by a
    # pytest process grown to 880 MB reported the parent's peak
    script = ("import re, sys; from graphbisect.cli.main import main; code = main(sys.argv[1:]); "
              "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "compare", str(model), "--inputs", str(bomb),
                           "--no-layerwise"], capture_output=True, text=True, check=False)
    # It decompressed all 2 GB (2.1 GB of RSS) before the shape check said "wrong shape".
    assert done.returncode == 2, done.stderr
    assert "refused before decompressing it" in done.stderr and "declares float32 (500000000,)" in done.stderr
    assert int(done.stdout.split()[-1]) < 500_000, done.stdout  # KiB


def test_a_real_internal_error_is_still_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from graphbisect.cli import compare_cmd

    def broken(_args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", "/graphbisect/own/file")  # not the machine's

    monkeypatch.setattr(compare_cmd, "run", broken)
    assert main(["compare", *EXAMPLE]) == 3
    assert "graphbisect bug" in capsys.readouterr().err
