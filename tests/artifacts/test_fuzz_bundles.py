"""A fuzzer in the test suite (issue 36): a bundle is a download, so every byte of it may be hostile.

Each case is a copy of a real bundle (real ONNX Runtime runs: the LayerNormFusion mismatch and the ReluClipFusion
crash of ``artifacts_builders``) with one seeded mutation (``bundle_fuzz.py``: a field of ``report.json`` or
``repro_config.json``, an ``.npz`` member's header, the bundle's zip members, the model's names and attributes).
On each, ``graphbisect verify`` (with ``--model`` when the oracle, target or tolerance was touched),
``graphbisect audit`` and the bundle's own ``repro.py`` run as separate processes (forked from one server that
imported graphbisect once: a damaged bundle is refused within milliseconds, so starting Python would be most of
the cost), each under a 4 GiB address-space cap (``RLIMIT_AS``) and a timeout, with ``HOME`` and ``TMPDIR`` in
the case's sandbox and marker programs named like common tools (``sh``, ``id``, ``curl``...) first on
``PATH``. A case holds when:

* ``verify`` exits 0, 1, 2 or 4 and ``audit`` and ``repro.py`` 0, 1 or 2: never 3 ("a graphbisect bug"), never
  a signal, never a timeout, and no Python traceback in what they print;
* nothing in the sandbox changed except the bundle's copy, the temp folder, the ``--json`` outputs named on the
  command line and ONNX Runtime's own telemetry under ``HOME`` (``~/.cache/Microsoft/DeveloperTools/.onnxruntime``,
  which the library writes itself) — hostile paths in the mutations name a folder beside them;
* no marker program ran (a recorded spec that is a program, ``python=`` or a pickle in an ``.npy``);
* each run's peak memory stayed under 1 GiB, and none ran into the cap (it must refuse what it cannot hold first).

The short run (:data:`SHORT` cases; the whole file took 38 s of CPU time, its processes included, and 104 s of
wall time on this 2-core machine under a load average of 8) is part of the README's test command. The long
run is the same test with more cases, also on a bundle written by a real ``graphbisect reduce`` (identity,
noise floor, audit and control fields) and one with hostile tensor names::

    GRAPHBISECT_FUZZ_CASES=2000 python -m pytest -q tests/artifacts/test_fuzz_bundles.py

``GRAPHBISECT_FUZZ_SEED`` (default 36) picks another sequence of cases. A case is named by its number
(``case-0017``) and is the same bytes on every machine for a seed: ``-k case-0017`` runs it again alone.
Every failure the fuzzer found is a fixed example at the end of this file.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from artifacts_builders import CRASH_TARGET, relu_clip_model, run_repro
from bundle_fuzz import Case, ForkServer, Ran, Sandbox, broken_rules, make_case, make_markers, rehash, run_case
from onnx import helper

from graphbisect.artifacts import BundleContent, write_bundle
from graphbisect.cli.main import main

pytest.importorskip("onnxruntime")

#: Cases of the short run: every family, on both bundles.
SHORT = 10
CASES = int(os.environ.get("GRAPHBISECT_FUZZ_CASES", SHORT))
SEED = int(os.environ.get("GRAPHBISECT_FUZZ_SEED", "36"))
LONG = CASES > SHORT
TIMEOUT = 180.0  # seconds a command may run (an honest audit here takes 4 s, one of a reduced bundle 13 s)
ADDRESS_SPACE = 4 << 30  # RLIMIT_AS of every command and worker
MEMORY_KB = 1 << 20  # peak resident memory of a command (with the workers it waited for)

_codes: Counter[str] = Counter()


@pytest.fixture(scope="module")
def bundles(mismatch_content: BundleContent, crash_content: BundleContent, hostile_content: BundleContent,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundles cases are made from (never changed: each case copies one)."""
    folder = tmp_path_factory.mktemp("fuzz-sources")
    found = {"mismatch": write_bundle(mismatch_content, folder / "mismatch"),
             "crash": write_bundle(crash_content, folder / "crash")}
    if LONG:
        found["hostile-names"] = write_bundle(hostile_content, folder / "hostile-names")
        model = folder / "clip.onnx"
        model.write_bytes(relu_clip_model().SerializeToString())
        assert main(["reduce", str(model), "--target", CRASH_TARGET, "-o", str(folder / "reduced")]) == 1
        found["reduced"] = folder / "reduced"
    return found


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_markers(tmp_path_factory.mktemp("fuzz-markers"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    started = ForkServer(tmp_path_factory.mktemp("fuzz-server") / "server.log", ADDRESS_SPACE)
    yield started
    started.close()
    if _codes:
        print(f"\nbundle fuzzer, seed {SEED}, {CASES} cases: runs by command and exit code: "
              + ", ".join(f"{key} x{count}" for key, count in sorted(_codes.items())))


def test_an_honest_bundle_runs_in_the_sandbox(bundles: dict[str, Path], server: ForkServer,
                                              markers: tuple[Path, Path], tmp_path: Path) -> None:
    """The sandbox itself breaks nothing: an unchanged bundle reproduces in all three (else every case would
    "hold" by failing early)."""
    sandbox = Sandbox(tmp_path, *markers)
    bundle = shutil.copytree(bundles["mismatch"], sandbox.work / "bundle")
    original = shutil.copyfile(bundle / "model.onnx", sandbox.work / "original.onnx")
    case = Case(0, "none", "mismatch", "unchanged", bundle, bundle, original)
    sandbox.rebase()
    found, runs = run_case(server, case, sandbox, timeout=TIMEOUT, memory_kb=MEMORY_KB)
    assert not found, found
    assert {name: ran.code for name, ran in runs.items()} == {"verify": 1, "audit": 1, "repro.py": 1}, \
        {name: ran.output[-2000:] for name, ran in runs.items()}
    assert json.loads((sandbox.work / "verify.json").read_text())["outcome"] == "reproduces"


def test_the_sandbox_sees_what_a_run_writes_starts_and_takes(server: ForkServer, markers: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    """Each check of a case can fail: a run that starts ``id`` through ``PATH``, writes beside the bundle,
    prints a traceback, exits 3, outgrows the memory cap or runs past its timeout is reported."""
    sandbox = Sandbox(tmp_path, *markers)
    script = sandbox.work / "bad.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "how = sys.argv[1]\n"
        "if how == 'exit3': sys.exit(3)\n"
        "if how == 'slow': time.sleep(60)\n"
        "if how == 'huge': ballast = bytearray(8 << 30)\n"
        "subprocess.run(['id'], check=False)\n"
        f"open({str(sandbox.root / 'outside' / 'victim')!r}, 'a').write('x')\n"
        "ballast = bytearray(1 << 30)\n"
        "raise ValueError('boom')\n")
    sandbox.rebase()

    def run(how: str, timeout: float = 30) -> tuple[Ran, list[str]]:
        ran = server.run("script", [str(script), how], cwd=sandbox.work, env=sandbox.env, timeout=timeout,
                         outputs=sandbox.root / "logs" / how)
        return ran, broken_rules("repro.py", ran, timeout=timeout, memory_kb=MEMORY_KB)

    ran, found = run("bad")
    found += sandbox.broken_rules()
    assert [line.split(":")[0].split(" (")[0] for line in found] == [
        "repro.py printed a traceback", f"repro.py took {ran.maxrss_kb // 1024} MB",
        "written outside the bundle's copy, the temp folder and the named outputs", "started programs"], found
    assert "['outside/victim']" in found[2] and "started programs: id" in found[3]
    assert run("exit3")[1][0].startswith("repro.py exited 3")
    assert run("slow", timeout=1)[1][0].startswith("repro.py ran past 1 s")
    ran, found = run("huge")  # the address-space cap holds: MemoryError, reported as running out of it
    assert "MemoryError" in ran.output and any("ran out of its address space" in line for line in found), found


@pytest.mark.parametrize("number", range(CASES), ids=[f"case-{n:04d}" for n in range(CASES)])
def test_a_mutated_bundle_is_refused_or_run_within_the_rules(number: int, bundles: dict[str, Path],
                                                             server: ForkServer, markers: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path, *markers)
    case = make_case(number, SEED, bundles, sandbox.work, sandbox.places)
    sandbox.rebase()  # what making the case wrote is the case, not a run's
    found, runs = run_case(server, case, sandbox, timeout=TIMEOUT, memory_kb=MEMORY_KB)
    _codes.update(f"{name}={ran.code}" for name, ran in runs.items())
    assert not found, case.describe() + "\n\n" + "\n\n".join(found)


# ------------------------------------------------------------------------------ what the fuzzer found, as examples
def _sent(bundle: Path, folder: Path, name: str, data: bytes) -> Path:
    """A copy of ``bundle`` with file ``name`` replaced by ``data`` and listed again in report.json."""
    copy = shutil.copytree(bundle, folder / "sent")
    (copy / name).write_bytes(data)
    rehash(copy, name)
    return copy


def test_repro_py_reads_a_values_manifest_nested_too_deep_as_damaged(bundles: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """Seed 36 case 15: ``__values__.json`` in ``inputs.npz`` nested 200,000 deep ended in repro.py's child with
    a RecursionError, whose traceback the script printed (exit 2): now "cannot read ... the bundle is damaged"."""
    with zipfile.ZipFile(bundles["crash"] / "inputs.npz") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("__values__.json", "[" * 200_000 + "]" * 200_000)
    done = run_repro(_sent(bundles["crash"], tmp_path, "inputs.npz", buffer.getvalue()))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "inputs.npz: RecursionError: maximum recursion depth exceeded" in done.stderr
    assert "(the bundle is damaged: copy it again)" in done.stderr


def _scan_without_body(model: onnx.ModelProto) -> None:
    next(node for node in model.graph.node if node.name == "mean2").op_type = "Scan"


def _function_calling_itself(model: onnx.ModelProto) -> None:
    node = next(node for node in model.graph.node if node.name == "pow")
    model.functions.append(helper.make_function("local", "F", ["a"], ["b"],
                                                [helper.make_node("F", ["a"], ["b"], domain="local")],
                                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    model.opset_import.append(helper.make_opsetid("local", 1))
    node.op_type, node.domain = "F", "local"
    del node.input[1:]


@pytest.mark.parametrize("edit", [_scan_without_body, _function_calling_itself], ids=["scan", "recursive-function"])
def test_a_model_onnx_cannot_infer_is_left_to_the_runtime_not_a_segfault(edit: Callable[[onnx.ModelProto], None],
                                                                         bundles: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """Seed 36 cases 23 and 17: the LayerNorm bundle's ``mean2`` made a ``Scan``, or ``pow`` a call of a local
    function calling itself (the model's output is declared without a shape, so ``npzguard.model_declared``
    infers it): ``verify`` and ``audit`` died of SIGSEGV (exit -11) before a word. Now the inference runs in a
    child process, whose crash leaves that output to the memory cap alone (a warning says so); the runtime then
    refuses the model, which ``verify`` reports as a different failure and ``audit`` as a claim that does not hold.
    """
    model = onnx.load(bundles["mismatch"] / "model.onnx")
    edit(model)
    sent = _sent(bundles["mismatch"], tmp_path, "model.onnx", model.SerializeToString())
    for command, verdict in (("verify", "DIFFERENT FAILURE"), ("audit", "DOES NOT HOLD")):
        done = subprocess.run([sys.executable, "-m", "graphbisect", command, str(sent)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 1, (command, done.returncode, done.stderr[-2000:])
        assert "ONNX's shape inference of" in done.stderr and "its outputs declared without a shape are held to " \
            "the memory cap alone" in done.stderr, done.stderr
        assert verdict in done.stdout and "INVALID_GRAPH" in done.stdout, done.stdout


def _flagged(data: bytes, *, flag: int = 0, method: int | None = None) -> bytes:
    """A zip (an .npz) with every member's local and central header marked ``flag`` / ``method``."""
    buffer = bytearray(data)
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = buffer.find(signature)
        while at >= 0:
            struct.pack_into("<H", buffer, at + flag_at, struct.unpack_from("<H", buffer, at + flag_at)[0] | flag)
            if method is not None:
                struct.pack_into("<H", buffer, at + flag_at + 2, method)
            at = buffer.find(signature, at + 4)
    return bytes(buffer)


def _npz_flagged(flag: int, method: int | None) -> Callable[[Path, Path], Path]:
    def make(bundle: Path, folder: Path) -> Path:
        return _sent(bundle, folder, "inputs.npz", _flagged((bundle / "inputs.npz").read_bytes(), flag=flag,
                                                            method=method))
    return make


def _npz_bad_crc(bundle: Path, folder: Path) -> Path:
    buffer = bytearray((bundle / "inputs.npz").read_bytes())
    for signature, crc_at in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
        struct.pack_into("<I", buffer, buffer.find(signature) + crc_at, 0xDEADBEEF)
    return _sent(bundle, folder, "inputs.npz", bytes(buffer))


def _bytes_input(bundle: Path, folder: Path) -> Path:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array(["\U0001f600".encode()] * 4, dtype="S4"))
    return _sent(bundle, folder, "inputs.npz", buffer.getvalue())


def _zip_file_and_folder(bundle: Path, folder: Path) -> Path:
    archive = folder / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for file in sorted(bundle.iterdir()):
            out.write(file, f"bundle/{file.name}")
        out.writestr("bundle/model.onnx/", b"")  # a folder member of the same name
    return archive


def _zip_member_twice(bundle: Path, folder: Path) -> Path:
    """``model.onnx`` twice: another model first, the hashed one last, which Python's zipfile extracts (so the
    bundle verified; a tool that takes the first entry shows another model than the one that ran)."""
    archive = folder / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as out, pytest.warns(UserWarning, match="Duplicate name"):
        out.writestr("bundle/model.onnx", b"another model")
        for file in sorted(bundle.iterdir()):
            out.write(file, f"bundle/{file.name}")
    return archive


def _npz_manifest_values_a_number(bundle: Path, folder: Path) -> Path:
    """Seed 37 case 177: ``__values__.json`` whose ``values`` is a number (-1e99999, read as -inf)."""
    with zipfile.ZipFile(bundle / "inputs.npz") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("__values__.json", '{"values": -1e99999}')
    return _sent(bundle, folder, "inputs.npz", buffer.getvalue())


def _zip_member_method(method: int) -> Callable[[Path, Path], Path]:
    """Seed 37 case 16: a bundle zip whose ``inputs.npz`` member says bzip2 (12) or lzma (14) over deflated bytes."""
    def make(bundle: Path, folder: Path) -> Path:
        archive = folder / "bundle.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for file in sorted(bundle.iterdir()):
                out.write(file, f"bundle/{file.name}")
        data = bytearray(archive.read_bytes())
        for signature, method_at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
            at = data.find(signature)
            while at >= 0:
                name_at = at + (30 if signature == b"PK\x03\x04" else 46)
                if data[name_at:name_at + len(b"bundle/inputs.npz")] == b"bundle/inputs.npz":
                    struct.pack_into("<H", data, at + method_at, method)
                at = data.find(signature, at + 4)
        archive.write_bytes(bytes(data))
        return archive
    return make


@pytest.mark.parametrize(("make", "said"), [
    (_npz_flagged(1, None), "is damaged: {inputs}: member 'x.npy' is encrypted"),
    (_npz_flagged(0, 93), "is damaged: {inputs}: member 'x.npy' is compressed with method 93, which Python's "
                          "zipfile does not read"),
    (_npz_flagged(0, 1), "is damaged: {inputs}: member 'x.npy' is compressed with method 1"),
    (_npz_bad_crc, "is damaged: {inputs}: member 'x.npy' cannot be read: BadZipFile: Bad CRC-32 for file 'x.npy'"),
    (_bytes_input, "is damaged: its inputs do not match the types model.onnx declares: inputs.npz: input 'x' holds "
                   "values of dtype |S4 (string), but model.onnx declares it float64"),
    (_zip_file_and_folder, "bundle.zip holds 'bundle/model.onnx' both as a file and as a folder"),
    (_zip_member_twice, "bundle.zip holds 'bundle/model.onnx' twice"),
    (_npz_flagged(0, 12), "is damaged: {inputs}: member 'x.npy' cannot be read: OSError: Invalid data stream"),
    (_npz_manifest_values_a_number, "is damaged: {inputs}: member '__values__.json' is not graphbisect's manifest"),
    (_zip_member_method(12), "bundle.zip is not a readable zip file: Invalid data stream"),
    (_zip_member_method(14), "bundle.zip is not a readable zip file")],
    ids=["npz-member-encrypted", "npz-member-method-93", "npz-member-method-1", "npz-member-bad-crc",
         "bytes-for-a-double-input", "zip-file-and-folder", "zip-member-twice", "npz-member-bzip2-damaged",
         "npz-manifest-values-a-number", "zip-member-bzip2-damaged",
         "zip-member-lzma-damaged"])
def test_found_by_the_long_run_a_damaged_bundle_exits_2(make: Callable[[Path, Path], Path], said: str,
                                                       bundles: dict[str, Path], tmp_path: Path) -> None:
    """An ``inputs.npz`` member with the encrypted flag (``RuntimeError: ... password required``) or compression
    method 93 (``NotImplementedError``, also method 1) or a wrong CRC (``BadZipFile``), an ``inputs.npz`` holding
    bytes (``|S4``) for the model's double input
    (a ``UnicodeDecodeError`` writing it for the worker, in ``audit``), a bundle zip holding ``model.onnx`` as
    a file and as a folder (``FileExistsError`` extracting it): each was exit 3, "a graphbisect bug" (and a
    traceback from ``repro.py``). Each is a damaged bundle, exit 2, saying what is wrong."""
    sent = make(bundles["crash"], tmp_path)
    said = said.format(inputs=sent / "inputs.npz")
    for command in ("verify", "audit"):
        done = subprocess.run([sys.executable, "-m", "graphbisect", command, str(sent)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 2, (command, done.returncode, done.stderr[-2000:])
        assert said in done.stderr and "graphbisect bug" not in done.stderr, done.stderr
    if sent.is_dir():
        done = run_repro(sent)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "repro.py cannot run: " in done.stderr and said.rsplit(": ", 1)[1] in done.stderr, done.stderr
        assert "the bundle is damaged" in done.stderr, done.stderr


#: repro_config.json edits the long run found, each a traceback from repro.py (seed 36 case 272, and cases 296,
#: 302 and 338 of its 400-case run), with the field repro.py now names.
CONFIG_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no-providers": (lambda config: config["options"].pop("providers"),
                     "options.providers must be a JSON list, not missing"),
    "per-output-a-string": (lambda config: config["tolerance"].update(per_output="y"),
                            "tolerance.per_output must be a JSON object, not a JSON string"),
    "identity-a-string": (lambda config: config.update(identity="abc"),
                          "identity must be a JSON object, not a JSON string"),
    "unsupported-pattern-minus-infinity": (lambda config: config.update(unsupported_pattern=-math.inf),
                                           "unsupported_pattern must be a regular expression (a JSON string), "
                                           "not a JSON number"),
    "per-output-pair-of-three": (lambda config: config["tolerance"].update(per_output={"y": [1, 2, 3]}),
                                 'tolerance.per_output["y"] must be a JSON list of 2 numbers, not a list of 3'),
    # seed 38 case 224: a KeyError printing what ran; library is optional (the spec names the backend)
    "library-a-number": (lambda config: config.update(library=5), "library must be a JSON string, not a JSON number"),
    # graphbisect writes a floor score of inf as "inf" (JSON has no number for it), which repro.py reads; a word
    # it does not is named
    "floor-score-a-word": (lambda config: config.update(noise_floor={"spec": "onnxruntime", "margin": 10.0,
                                                                     "scores": {"y": "big"}}),
                           'noise_floor.scores["y"] must be a JSON number, "inf" or "nan", not a JSON string'),
}


@pytest.mark.parametrize("edit", sorted(CONFIG_EDITS))
def test_found_by_the_long_run_repro_py_names_a_config_field_it_cannot_use(edit: str, bundles: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """repro.py's check of repro_config.json looked at its top-level fields only: a nested field it reads of
    another kind (or missing) ended in a KeyError, TypeError or AttributeError traceback. Now exit 2, naming it."""
    copy = shutil.copytree(bundles["mismatch"], tmp_path / "sent")
    config = json.loads((copy / "repro_config.json").read_text())
    change, said = CONFIG_EDITS[edit]
    change(config)
    (copy / "repro_config.json").write_text(json.dumps(config))
    done = run_repro(copy)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"repro.py cannot run: repro_config.json: {said}: the bundle is damaged" in done.stderr, done.stderr


def _deep_config_entry(bundle: Path) -> None:
    """Seed 37 case 230: a repro_config.json entry nested 100,000 deep (read where a custom backend's origin is
    looked up: a RecursionError, exit 3)."""
    text = (bundle / "repro_config.json").read_text()
    at = text.rindex("}")
    (bundle / "repro_config.json").write_text(text[:at] + ', "extra": ' + '{"a":' * 100_000 + "1" + "}" * 100_000
                                              + text[at:])
    rehash(bundle, "repro_config.json")


def _long_node_name(bundle: Path) -> None:
    """Seed 37 case 239: a node named with 100,002 characters (here 1,000,002), which the crash message holds:
    normalizing it took a minute per message (a path pattern tried from every character of the name), and verify
    ran past 180 s; now linear."""
    model = onnx.load(str(bundle / "model.onnx"))
    next(node for node in model.graph.node if node.op_type == "Clip").name = "x" * 1_000_002
    onnx.save(model, str(bundle / "model.onnx"))
    rehash(bundle, "model.onnx")


@pytest.mark.parametrize("edit", [_deep_config_entry, _long_node_name], ids=["deep-config-entry", "long-node-name"])
def test_found_by_the_long_run_a_bundle_still_verifies(edit: Callable[[Path], None], bundles: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """Edits that leave what verify and audit run intact: they run it (exit 0 or 1), not "a graphbisect bug" or
    past the fuzzer's limit (here: 120 s for what takes seconds)."""
    sent = shutil.copytree(bundles["crash"], tmp_path / "sent")
    edit(sent)
    for command in ("verify", "audit"):
        done = subprocess.run([sys.executable, "-m", "graphbisect", command, str(sent)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode in (0, 1), (command, done.returncode, done.stderr[-2000:])
        assert "graphbisect bug" not in done.stderr, done.stderr


def test_found_by_the_long_run_repro_py_runs_without_the_library_field(bundles: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """Seed 38 case 224: repro_config.json without ``library`` (only printed) was a KeyError traceback after the
    run; the backend's name comes from the spec then."""
    copy = shutil.copytree(bundles["mismatch"], tmp_path / "sent")
    config = json.loads((copy / "repro_config.json").read_text())
    config.pop("library")
    (copy / "repro_config.json").write_text(json.dumps(config))
    done = run_repro(copy)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout, done.stdout


def _size_of_401_digits(bundle: Path) -> str:
    """Seed 42 case 198: report.json listing a file of 10**400 bytes; checking it against "a finite number" asked
    ``math.isfinite`` of an int no float holds (OverflowError, exit 3)."""
    report = json.loads((bundle / "report.json").read_text())
    report["files"][0]["bytes"] = 10**400
    (bundle / "report.json").write_text(json.dumps(report))
    return "is damaged: report.json files[0].bytes: expected an integer, found an integer of 1329 bits"


def _external_data_before_the_file(bundle: Path) -> str:
    """Seed 42 case 173: an initializer whose external data lies at offset -1 of ``inputs.npz`` (a file the bundle
    hashes): the checker's onnx.load seeked there (OSError EINVAL, exit 3), and verify called what ONNX Runtime
    then refused "a different failure, the bug may be fixed"."""
    model = onnx.load(str(bundle / "model.onnx"))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "inputs.npz"), ("offset", "-1"), ("length", str(2**40))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(bundle / "model.onnx"))
    rehash(bundle, "model.onnx")
    return (f"is damaged: model.onnx reads the external data of tensor {tensor.name!r} from 'inputs.npz' at bytes "
            f"-1 to {2**40 - 1}, outside its {(bundle / 'inputs.npz').stat().st_size} bytes")


@pytest.mark.parametrize("edit", [_size_of_401_digits, _external_data_before_the_file],
                         ids=["size-of-401-digits", "external-data-before-the-file"])
def test_found_by_the_long_run_verify_and_audit_name_the_damage(edit: Callable[[Path], str],
                                                                bundles: dict[str, Path], tmp_path: Path) -> None:
    """Each was exit 3 ("a graphbisect bug") in audit (and verify for the size): a damaged bundle, exit 2, saying
    what is wrong; repro.py, which reads neither, runs or refuses without a traceback."""
    sent = shutil.copytree(bundles["crash"], tmp_path / "sent")
    said = edit(sent)
    for command in ("verify", "audit"):
        done = subprocess.run([sys.executable, "-m", "graphbisect", command, str(sent)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 2, (command, done.returncode, done.stderr[-2000:])
        assert said in done.stderr and "graphbisect bug" not in done.stderr, done.stderr
    done = run_repro(sent)
    assert done.returncode in (0, 1, 2) and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_found_by_the_long_run_a_name_that_is_not_text_is_no_internal_error(bundles: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    """Seed 43 case 197: flipped bytes left a node name that is not UTF-8, which protobuf hands over as bytes;
    matching the crash's message against the model's names raised TypeError (exit 3). Such a name cannot be in a
    message: verify and audit run (or refuse) the model as it is."""
    sent = shutil.copytree(bundles["crash"], tmp_path / "sent")
    model = onnx.load(str(sent / "model.onnx"))
    name = model.graph.node[0].name.encode()
    assert len(name) >= 2
    data = (sent / "model.onnx").read_bytes()
    (sent / "model.onnx").write_bytes(data.replace(name, name[:1] + b"\x85" + name[2:], 1))
    rehash(sent, "model.onnx")
    for command in ("verify", "audit"):
        done = subprocess.run([sys.executable, "-m", "graphbisect", command, str(sent)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode in (0, 1, 2), (command, done.returncode, done.stderr[-2000:])
        assert "graphbisect bug" not in done.stderr and "Traceback" not in done.stderr, done.stderr
