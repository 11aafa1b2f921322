"""The bundle fuzzer's parts: seeded mutations of a real bundle, a sandbox that sees what a run wrote and started,
and the commands run on each case (see ``test_fuzz_bundles.py`` for what is asserted and how to run it long).

A case is a copy of a real bundle with one mutation, chosen by ``random.Random(f"{seed}:{number}")`` alone, so
a case number names the same bytes on every machine. The families of mutations (:data:`FAMILIES`):

* ``report``: a field of ``report.json`` (any path, found by walking the file) set to another type, a huge or
  deep value, NaN/Infinity, a string with control characters or newlines, a formula (``=HYPERLINK(...)``), a
  path outside the bundle or a spec that runs a program or writes a file; or a key removed or added; or the
  file's text cut, made non-UTF-8, given a 5,000-digit number or a duplicated key.
* ``report-shape``: a field the readers rely on (:data:`graphbisect.artifacts.report_schema.REPORT_SCHEMA`)
  given a value *of its shape* with hostile content, so the mutation gets past the load check into the readers.
* ``repro-config``: the same for ``repro_config.json``, listed again in ``report.json`` (as a sender would).
* ``npz``: a member of ``inputs.npz``/``oracle_outputs.npz``/``target_outputs.npz``: its ``.npy`` header's
  declared shape, dtype (a pickle that runs ``id`` as ``|O``) or order, its data cut or grown, its name, the
  members added, removed or counted past the cap, ``__values__.json`` entries pointing elsewhere, the zip's
  flags and methods; rehashed.
* ``zip``: the bundle as a ``.zip`` (what ``verify``/``audit`` also take) with members named ``../``, absolute,
  links, over 1,000 members, the encrypted flag, another method, a lying size, duplicates, a cut archive.
* ``model``: ``model.onnx``'s names (tensors, nodes, the graph), attributes, op types and domains, declared
  shapes and types, opsets and IR version, external data pointing outside the bundle or at a device, a
  function calling itself, metadata, or its bytes cut; rehashed.

Hostile strings name two places by placeholder: ``{OUTSIDE}``, a folder of the case's sandbox that no run may
write into, and ``{BIN}``, the folder of marker programs (named like common tools) put first on ``PATH``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.artifacts.report_schema import REPORT_SCHEMA, Shape

FAMILIES = ("report", "report-shape", "repro-config", "npz", "zip", "model")

#: Programs a bundle must never start: each is a marker script on ``PATH`` that records its run and fails.
#: (Python is started by its absolute path, as graphbisect starts its workers.)
MARKED_PROGRAMS = ("sh", "bash", "dash", "id", "whoami", "uname", "curl", "wget", "nc", "touch", "cat", "cp", "mv",
                   "rm", "ls", "env", "chmod", "ln", "tee", "dd", "perl", "python", "python3", "pip", "git", "ssh",
                   "sudo", "su", "xdg-open", "evil.sh", "trtexec", "iree-compile", "ld", "cc", "gcc")

HOSTILE_STRINGS = (
    "", " ", "x", "\x00", "\x1b]0;owned\x07\x1b[2J\x1b[31m", "y\n\nPASS: outputs match", "line\rPASS: fixed",
    "\u202egnp.exe", "\udcff", "é×\u2028", "\t=1+1", '=HYPERLINK("http://example.invalid","x")', "+cmd|' /C calc'!A0",
    "@SUM(1+1)", "-1+1", "../../outside/victim", "{OUTSIDE}/victim", "/etc/passwd", "/dev/zero", "/proc/self/mem",
    "..", "/", ".", "~/.bashrc", "$(id > {OUTSIDE}/pwned)", "`id`", "'; import os; os.system('id') #",
    '"""\n__import__("os").system("id")\n"""', "{model}", "{outputs}", "%s%n%x", "NaN", "null",
    "cmd:cmd=id", "command:cmd=touch {OUTSIDE}/pwned", "CMD:cmd=id", "command:cmd={BIN}/evil.sh {model}",
    "onnxruntime:python={BIN}/python3", "onnxruntime:opt_level=all,python={BIN}/evil.sh",
    "onnxruntime:config=session.collect_node_memory_stats_to_file={OUTSIDE}/stats",
    "onnxruntime:config=session.debug_layout_transformation=1",
    "onnxruntime:providers=CUDAExecutionProvider,trt.engine_cache_path={OUTSIDE}/cache",
    "openvino:config=CACHE_DIR={OUTSIDE}/cache", "openvino:tactics={OUTSIDE}/tactics.json",
    "iree:flags=--iree-hal-dump-executable-files-to={OUTSIDE}/dump",
    "iree:flags=--iree-llvmcpu-embedded-linker-path={BIN}/ld", "tensorrt:keep_fp32=@{OUTSIDE}/list",
    "onnxruntime:opt_level=all", "onnxruntime:opt_level=disable", "onnxruntime", "reference", "paddle",
    "onnxruntime:timeout=1e308", "onnxruntime:threads=99999999999", "onnxruntime:opt_level=all,opt_level=basic",
    "nonexistent-backend:x=1", "onnxruntime:", ":", ",,,", "onnxruntime:=", "onnxruntime:opt_level",
)

HOSTILE_NUMBERS: tuple[Any, ...] = (0, -1, 1, 2, 3, 2**31, 2**53 + 1, 2**63, -(2**63), 2**64 + 1, 10**400, 1.5, -0.0,
                                    1e-320, 5e-324, 1e308, -1e308, math.nan, math.inf, -math.inf)

#: Raw JSON texts (written in place of a value): deep nesting, numbers Python's json refuses or makes infinite.
RAW_VALUES = ("[" * 40 + "]" * 40, "[" * 3000 + "]" * 3000, "[" * 200_000 + "]" * 200_000,
              '{"a":' * 3000 + "0" + "}" * 3000, "1" * 5000, "1e99999", "-1e99999", "-0")
_RAW = "\x00raw:{}\x00"

#: A pickle (protocol 0) that runs ``id``: what an ``.npy`` of dtype ``|O`` holds, read with ``allow_pickle``.
PICKLE_RUNNING_ID = b"cposix\nsystem\n(Vid\ntR."


def fill(text: str, places: dict[str, str]) -> str:
    """``text`` with ``{OUTSIDE}`` and ``{BIN}`` replaced (other braces are left as they are)."""
    for key, value in places.items():
        text = text.replace("{" + key + "}", value)
    return text


# ------------------------------------------------------------------------------------------------ JSON values
class Values:
    """Hostile values, for one case's random stream and sandbox places."""

    def __init__(self, rng: random.Random, places: dict[str, str]) -> None:
        self.rng = rng
        self.places = places

    def string(self) -> str:
        r = self.rng.random()
        if r < 0.08:
            return "x" * self.rng.choice((300, 5000, 100_000))
        if r < 0.16:
            return "".join(chr(self.rng.choice((0, 7, 8, 10, 13, 27, 0x7F, 0x85, 0x202E, 0xFEFF, 0x41)))
                           for _ in range(self.rng.randint(1, 12)))
        return fill(self.rng.choice(HOSTILE_STRINGS), self.places)

    def number(self) -> Any:
        return self.rng.choice(HOSTILE_NUMBERS)

    def raw(self) -> str:
        return _RAW.format(self.rng.choice(RAW_VALUES))

    def any(self) -> Any:
        """A value of any JSON type (or a raw text)."""
        r = self.rng.random()
        if r < 0.35:
            return self.string()
        if r < 0.6:
            return self.number()
        if r < 0.7:
            return self.raw()
        return self.rng.choice((None, True, False, [], {}, [None], {"": None}, [self.string()],
                                {self.string(): self.number()}, list(range(self.rng.choice((3, 20_000)))),
                                {f"k{i}": i for i in range(2000)}))

    def like(self, value: Any) -> Any:
        """A value replacing ``value``: most often one of its own type, perturbed."""
        rng = self.rng
        if rng.random() < 0.45:
            return self.any()
        if isinstance(value, bool):
            return rng.choice((not value, 1, 0, "true", None))
        if isinstance(value, (int, float)):
            return self.number()
        if isinstance(value, str):
            choices: list[Callable[[], str]] = [
                self.string, lambda: value + self.string(), lambda: self.string() + value,
                lambda: value[: rng.randint(0, len(value))], lambda: value * rng.choice((2, 1000)),
                value.upper, lambda: value + "\n" + value]
            return rng.choice(choices)()
        if isinstance(value, list):
            if not value:
                return [self.any()]
            choices_l: list[Callable[[], Any]] = [
                lambda: [], lambda: value[:-1], lambda: [*value, self.any()], lambda: value[::-1],
                lambda: value * rng.choice((2, 500)), lambda: [self.like(v) for v in value], lambda: value[0]]
            return rng.choice(choices_l)()
        if isinstance(value, dict):
            keys = list(value)
            if not keys or rng.random() < 0.3:
                return {**value, self.string(): self.any()}
            key = rng.choice(keys)
            return rng.choice((lambda: {k: v for k, v in value.items() if k != key},
                               lambda: {**value, key: self.like(value[key])}, lambda: {}, lambda: list(value)))()
        return self.any()

    def of_shape(self, shape: Shape, depth: int = 0) -> Any:
        """A value of ``shape`` (what the load check lets through), with hostile content."""
        rng = self.rng
        if shape.nullable and rng.random() < 0.15:
            return None
        kind = shape.kind
        if kind == "string":
            return self.string()
        if kind == "integer":
            return rng.choice((0, -1, 1, 2, 7, 2**31, 2**63, -(2**63), 10**30, 2**64 + 1))
        if kind == "number":
            return rng.choice((0, 0.0, -1, 1e-320, 5e-324, 1e308, -1e308, 1.5, 2**63, 1e-30))
        if kind == "any-number":
            return rng.choice((0, -1, 1e308, "inf", "-inf", "nan", math.nan, math.inf, 2**70))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "pair":
            return [self.of_shape(Shape("number")), self.of_shape(Shape("number"))]
        if kind == "list":
            count = rng.choice((0, 1, 2, 3, 3000)) if depth < 2 else rng.choice((0, 1))
            item = shape.item or Shape("string")
            first = [self.of_shape(item, depth + 1) for _ in range(min(count, 3))]
            return (first * (count // max(1, len(first)) + 1))[:count] if first else []
        if kind == "map":
            values = shape.item
            return {self.string(): self.of_shape(values, depth + 1) if values else self.any()
                    for _ in range(rng.choice((0, 1, 2)))}
        value = {name: self.of_shape(field_shape, depth + 1) for name, field_shape in shape.fields
                 if rng.random() < 0.85}
        if rng.random() < 0.2:
            value[self.string()] = self.any()
        return value


def dumps(doc: Any) -> str:
    """JSON text of ``doc`` with NaN/Infinity as Python writes them and raw texts put in place."""
    text = json.dumps(doc, indent=1, allow_nan=True)
    start = 0
    while True:
        at = text.find('"\\u0000raw:', start)
        if at < 0:
            return text
        end = text.find('\\u0000"', at)
        raw = json.loads(text[at:end + 7])[5:-1]
        text = text[:at] + raw + text[end + 7:]
        start = at + len(raw)


def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value below ``doc`` (keys and list indices)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from json_paths(value, (*prefix, key))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutate_json_text(text: str, values: Values, *, schema: dict[str, Shape] | None = None,
                     shaped: bool = False) -> tuple[str, str, str | None]:
    """One mutation of a JSON file's text: (new text, what was done, the top-level field it touched)."""
    rng = values.rng
    doc = json.loads(text)
    r = rng.random()
    if shaped and schema:
        name, shape = rng.choice(sorted(schema.items()))
        path: tuple[Any, ...] = (name,)
        while shape.kind == "object" and shape.fields and rng.random() < 0.5:
            sub, shape = rng.choice(shape.fields)
            path = (*path, sub)
        node = doc
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = value = values.of_shape(shape)
        return dumps(doc), f"{'.'.join(path)} = {short(value)} (of its shape)", name
    if r < 0.12:  # the text itself
        how = rng.choice(("cut", "non-utf8", "bom", "empty", "null", "list", "duplicate key", "huge"))
        if how == "cut":
            return text[: rng.randint(0, len(text) - 1)], "text cut", None
        if how == "non-utf8":
            at = rng.randint(0, len(text) - 1)
            return text[:at] + "\udcff" + text[at:], "a byte that is not UTF-8", None
        if how == "bom":
            return "\ufeff" + text, "a byte-order mark", None
        if how == "empty":
            return "", "empty", None
        if how == "null":
            return "null", "null", None
        if how == "list":
            return "[" + text + "]", "a list around the object", None
        if how == "duplicate key" and isinstance(doc, dict) and doc:
            key = rng.choice(sorted(doc))
            value = values.any()
            return (text.rstrip()[:-1] + f", {json.dumps(key)}: {dumps(value)}}}", f"{key} again = {short(value)}",
                    key)
        return text + " " * 1000 + "x" * rng.choice((10, 1_000_000)), "trailing text", None
    paths = list(json_paths(doc))
    read = [path for path in paths if schema and path[0] in schema]
    if read and rng.random() < 0.7:  # mostly fields a reader relies on: the others only cost a full run
        paths = read
    if not paths:
        return dumps(values.any()), "replaced whole", None
    path = rng.choice(paths)
    parent = _parent(doc, path)
    if r < 0.22 and isinstance(parent, dict):
        del parent[path[-1]]
        return dumps(doc), f"{'.'.join(map(str, path))} removed", str(path[0])
    if r < 0.3:
        target = parent if isinstance(parent, dict) else doc
        key = values.string() if rng.random() < 0.5 or not schema else rng.choice(sorted(schema))
        target[key] = value = values.any()
        return dumps(doc), f"added {short(key)} = {short(value)}", key if target is doc else str(path[0])
    parent[path[-1]] = value = values.like(parent[path[-1]])
    return dumps(doc), f"{'.'.join(map(str, path))} = {short(value)}", str(path[0])


def short(value: Any, limit: int = 90) -> str:
    """``value`` for a case's description: a repr cut to ``limit`` characters."""
    text = repr(value)
    if isinstance(value, str) and value.startswith("\x00raw:"):
        text = "raw " + repr(value[5:45])
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


def write_text(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


# ------------------------------------------------------------------------------------------------ bundle files
def rehash(bundle: Path, *names: str) -> None:
    """List ``names`` in ``report.json`` with their new size and sha256, as a sender editing a bundle would."""
    report = json.loads((bundle / "report.json").read_text())
    for entry in report["files"]:
        if entry.get("name") in names and "sha256" in entry:
            data = (bundle / entry["name"]).read_bytes()
            entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (bundle / "report.json").write_text(json.dumps(report, indent=1))


def _npy_parts(data: bytes) -> tuple[dict[str, Any], bytes]:
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(
        stream)
    return {"shape": header[0], "fortran_order": header[1], "descr": np.lib.format.dtype_to_descr(header[2])}, \
        data[stream.tell():]


def _npy(header: dict[str, Any], payload: bytes) -> bytes:
    text = repr({"descr": header["descr"], "fortran_order": header["fortran_order"], "shape": header["shape"]})
    text = text + " " * ((64 - (len(text) + 11) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1") + payload


Members = list[tuple[str, bytes]]


def mutate_npz(path: Path, values: Values) -> str:
    """One mutation of an ``.npz`` file: a member's ``.npy`` (:func:`_npy_mutation`), its members
    (:func:`_members_mutation`) or the zip's headers (:func:`mutate_zip_bytes`): what was done."""
    rng = values.rng
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    arrays = [i for i, (name, _) in enumerate(members) if name.endswith(".npy")]
    how = rng.choice(("shape", "shape", "dtype", "dtype", "order", "data", "header", "name", "members", "manifest",
                      "zip"))
    if how == "zip":
        data, said = mutate_zip_bytes(_zip_of(members), rng)
        path.write_bytes(data)
        return f"the zip: {said}"
    if how in ("shape", "dtype", "order", "data", "header") and arrays:
        index = rng.choice(arrays)
        name, data = members[index]
        data, said = _npy_mutation(how, data, rng)
        members[index] = (name, data)
        said = f"{name}: {said}"
    else:
        said = _members_mutation(how, members, values)
    path.write_bytes(_zip_of(members))
    return said


def _npy_mutation(how: str, data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """An ``.npy``'s header made to lie about its shape, dtype (a pickle that runs ``id``) or order, its data cut
    or grown, or its header garbled: (its bytes, what was done)."""
    if how == "header":
        garbage = rng.choice((b"\x93NUMPY\x03\x00", b"\x93NUMPX\x01\x00", b"\x93NUMPY\x01\x00\xff\xff",
                              b"\x93NUMPY\x02\x00\xff\xff\xff\x7f",
                              b"\x93NUMPY\x01\x00\x40\x00{'descr': __import__('os').system('id'), 'shape': ()}   \n"))
        return garbage + data[len(garbage):], f"header {garbage[:12]!r}"
    header, payload = _npy_parts(data)
    if how == "shape":
        shape = tuple(header["shape"])
        header["shape"] = rng.choice(((), (0,), (1 << 40,), (2**63 - 1,), (4, 1 << 30), (1 << 20,), (*shape, 1),
                                      shape[::-1], (1,) * 40, (0, 1 << 62), (len(payload),), (3, 5)))
    elif how == "dtype":
        header["descr"] = rng.choice(("<f8", "<f2", "|O", "<U8", "|S4", "|V16", ">f4", "<c16", "|b1", "<i8",
                                      "<M8[s]", "<m8[D]", [("a", "<f4"), ("b", "<i8")], "|u1", "<U1000000"))
        if header["descr"] == "|O":
            payload = PICKLE_RUNNING_ID
    elif how == "order":
        header["fortran_order"] = True
    else:
        payload = payload[: rng.randint(0, max(0, len(payload) - 1))] if rng.random() < 0.5 else \
            payload + bytes(rng.choice((1, 4, 4096)))
    return _npy(header, payload), f"{how} -> {short(header)} ({len(payload)} bytes)"


#: Entries of ``__values__.json`` (how a value a plain ``.npy`` cannot hold is described) that point elsewhere.
MANIFEST_ENTRIES: tuple[dict[str, Any], ...] = (
    {"file": "../../outside.npy", "dtype": "<f4", "shape": [4, 4]}, {"file": "x.npy", "dtype": "|O", "shape": [4, 4]},
    {"file": "x.npy", "dtype": "<f4", "shape": [1 << 40]}, {"offset": 1 << 62, "dtype": "<f4", "shape": [4]},
    {"sequence": [{"file": "x.npy", "dtype": "<f4", "shape": [4, 4]}] * 5000},
    {"optional": {"optional": {"optional": None}}},
    {"file": "x.npy", "dtype": "<u2", "shape": [4, 4], "elem_type": 999, "onnx_type": "EVIL"},
    {"file": "x.npy", "dtype": "<U8", "shape": [4, 4], "onnx_type": "STRING"})


def _members_mutation(how: str, members: Members, values: Values) -> str:
    """An ``.npz``'s members renamed, removed, doubled, added (junk, or past the count cap), or described by a
    hostile ``__values__.json``; changed in place: what was done."""
    rng = values.rng
    if how == "name":
        index = rng.randrange(len(members))
        new = fill(rng.choice(("../x.npy", "/abs.npy", "x\n.npy", ".npy", "x.npy/", "__values__.json",
                               "{OUTSIDE}/victim.npy", "a/../../b.npy", "\x1b[2J.npy", "y.npy", "x.npy")),
                   values.places)
        said = f"member {members[index][0]!r} renamed {new!r}"
        members[index] = (new, members[index][1])
        return said
    if how == "manifest":
        entry = rng.choice((*MANIFEST_ENTRIES, values.any()))
        manifest: Any = {"values": {name[:-4]: entry for name, _ in members if name.endswith(".npy")}}
        if rng.random() < 0.3:
            manifest = rng.choice((values.any(), {"values": values.any()}, []))
        members[:] = [m for m in members if m[0] != "__values__.json"]
        members.append(("__values__.json", dumps(manifest).encode("utf-8", "surrogateescape")))
        return f"__values__.json = {short(manifest)}"
    kind = rng.choice(("remove", "duplicate", "junk", "many"))
    if kind == "remove":
        return f"member {members.pop(rng.randrange(len(members)))[0]!r} removed"
    if kind == "duplicate":
        name = rng.choice(members)[0]
        members.append((name, _npy({"descr": "<f4", "fortran_order": False, "shape": (2, 2)}, bytes(16))))
        return f"member {name!r} twice"
    if kind == "junk":
        members.append(("junk.npy", b"not an npy" * rng.choice((1, 1000))))
        return "a member that is not an .npy"
    count = rng.choice((70_000, 3000))
    members += [(f"m{i}.npy", b"") for i in range(count)]
    return f"{count} more members"


def _zip_of(members: Members, *, links: dict[str, str] | None = None,
            method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0))
            info.compress_type = method
            if links and name in links:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, links[name].encode() if links and name in links else data)
    return out.getvalue()


def mutate_zip_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One header-level mutation of a zip (flags, method, sizes, offsets, a cut): (its bytes, what was done)."""
    buffer = bytearray(data)
    how = rng.choice(("encrypted", "method", "size", "crc", "cut", "offset"))
    entries = [at for at in _find_all(buffer, b"PK\x01\x02")]
    if not entries or how == "cut":
        return bytes(buffer[: rng.randint(0, max(0, len(buffer) - 1))]), "archive cut"
    at = rng.choice(entries)
    name_len = struct.unpack_from("<H", buffer, at + 28)[0]
    name = bytes(buffer[at + 46: at + 46 + name_len]).decode("utf-8", "replace")
    local = struct.unpack_from("<I", buffer, at + 42)[0]
    if how == "encrypted":
        for where in (at + 8, local + 6):
            struct.pack_into("<H", buffer, where, struct.unpack_from("<H", buffer, where)[0] | 1)
    elif how == "method":
        method = rng.choice((1, 6, 9, 12, 14, 93, 95, 98, 99, 65535))
        for where in (at + 10, local + 8):
            struct.pack_into("<H", buffer, where, method)
        how = f"method {method}"
    elif how == "size":
        size = rng.choice((0, 1, 2**31, 2**32 - 1))
        struct.pack_into("<I", buffer, at + 24, size)
        struct.pack_into("<I", buffer, local + 22, size)
        how = f"uncompressed size {size}"
    elif how == "crc":
        struct.pack_into("<I", buffer, at + 16, 0xDEADBEEF)
        struct.pack_into("<I", buffer, local + 14, 0xDEADBEEF)
    else:
        struct.pack_into("<I", buffer, at + 42, rng.choice((0, 2**31, len(buffer) + 10)))
    return bytes(buffer), f"member {name!r}: {how}"


def _find_all(data: bytearray, signature: bytes) -> Iterator[int]:
    at = data.find(signature)
    while at >= 0:
        yield at
        at = data.find(signature, at + 4)


def zip_bundle(bundle: Path, archive: Path, rng: random.Random, places: dict[str, str]) -> str:
    """``bundle`` as the zip ``archive`` (members under ``bundle/``) with one mutation: what was done."""
    members = [(f"bundle/{file.name}", file.read_bytes()) for file in sorted(bundle.iterdir())]
    how = rng.choice(("name", "name", "link", "count", "headers", "headers", "layout", "duplicate", "dir"))
    links: dict[str, str] = {}
    said = how
    if how == "name":
        name = fill(rng.choice(("../escape.txt", "bundle/../../escape.txt", "/tmp/absolute.txt",
                                "{OUTSIDE}/victim", "bundle/x\n.txt", "C:\\x.txt", "bundle/" + "a" * 300,
                                "bundle/\x1b[2J", "../bundle/model.onnx", "bundle//model.onnx", "./bundle/x")),
                    places)
        members.append((name, b"pwned"))
        said = f"a member named {name!r}"
    elif how == "link":
        victim = rng.choice(("bundle/model.onnx", "bundle/inputs.npz", "bundle/report.json", "bundle/extra"))
        links[victim] = fill(rng.choice(("/etc/passwd", "../../outside/victim", "{OUTSIDE}/victim", "/dev/zero",
                                         "model.onnx")), places)
        if victim == "bundle/extra":
            members.append((victim, b""))
        said = f"{victim} a link to {links[victim]!r}"
    elif how == "count":
        count = rng.choice((999, 1001, 5000))
        members += [(f"bundle/empty{i}", b"") for i in range(count)]
        said = f"{count} more members"
    elif how == "layout":
        kind = rng.choice(("flat", "two", "deep"))
        if kind == "flat":
            members = [(name.split("/", 1)[1], data) for name, data in members]
        elif kind == "two":
            members += [(name.replace("bundle/", "other/", 1), data) for name, data in members]
        else:
            members = [(name.replace("bundle/", "a/b/c/bundle/", 1), data) for name, data in members]
        said = f"layout {kind}"
    elif how == "duplicate":
        name = rng.choice(members)[0]
        members.append((name, b"\x00" * 64))
        said = f"{name!r} twice"
    elif how == "dir":
        members.append(("bundle/sub/", b""))
        members.append(("bundle/model.onnx/", b""))
        said = "folder members"
    data = _zip_of(members, links=links)
    if how == "headers":
        data, said = mutate_zip_bytes(data, rng)
    archive.write_bytes(data)
    return said


# ------------------------------------------------------------------------------------------------ the model
def _storable(text: str) -> str:
    """``text`` as a protobuf string field can hold it (UTF-8: a lone surrogate, hostile in JSON, becomes '?'),
    so the case is the mutation, not the harness's own UnicodeEncodeError (seed 39 case 17)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def mutate_model(path: Path, values: Values) -> str:
    """One mutation of an ONNX model file (:data:`MODEL_MUTATIONS`, or its bytes cut or flipped): what was done."""
    rng = values.rng
    if rng.random() < 0.08:
        data = bytearray(path.read_bytes())
        if rng.random() < 0.5:
            path.write_bytes(bytes(data[: rng.randint(0, len(data) - 1)]))
            return "model.onnx cut"
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return "model.onnx bytes flipped"
    model = onnx.load(path)
    name = _storable(values.string()) if rng.random() < 0.8 else "x" * 100_000
    how = rng.choice(sorted(MODEL_MUTATIONS))
    said = MODEL_MUTATIONS[how](model, values, name)
    path.write_bytes(model.SerializeToString())
    return said


def _rename(model: onnx.ModelProto, values: Values, name: str) -> str:
    """A tensor renamed everywhere, or in some places only (dangling), a node or the graph renamed."""
    rng, graph = values.rng, model.graph
    kind = rng.choice(("tensor", "tensor-one", "node", "graph"))
    if kind == "node":
        rng.choice(graph.node).name = name
    elif kind == "graph":
        graph.name = name
    else:
        old = rng.choice(sorted({*(t for n in graph.node for t in (*n.input, *n.output)),
                                 *(v.name for v in (*graph.input, *graph.output, *graph.initializer))} - {""}))
        everywhere = kind == "tensor"
        for node in graph.node:
            for names in (node.input, node.output):
                for i, tensor in enumerate(names):
                    if tensor == old and (everywhere or rng.random() < 0.5):
                        names[i] = name
        for value in (*graph.input, *graph.output, *graph.initializer):
            if value.name == old and (everywhere or rng.random() < 0.5):
                value.name = name
        kind += f" {old!r}"
    return f"{kind} renamed {short(name)}"


def _attribute(model: onnx.ModelProto, values: Values, name: str) -> str:
    """An attribute's value made extreme, its type changed, removed, or an unknown one added."""
    rng = values.rng
    node = rng.choice([n for n in model.graph.node if n.attribute] or list(model.graph.node))
    kind = rng.choice(("value", "type", "remove", "add")) if node.attribute else "add"
    attribute = rng.choice(node.attribute) if node.attribute else None
    if attribute is None or kind == "add":
        node.attribute.append(helper.make_attribute(name or "a", rng.choice((1, 1.5, "s", [1, 2]))))
    elif kind == "value":
        if attribute.ints:
            attribute.ints[:] = [rng.choice((-(2**63), 2**63 - 1, 1 << 40, -100, 99)) for _ in attribute.ints] * \
                rng.choice((1, 1, 1000))
        else:
            attribute.i = rng.choice((-(2**63), 2**63 - 1, -1, 7, 1 << 40))
    elif kind == "type":
        attribute.type = rng.choice((onnx.AttributeProto.STRING, onnx.AttributeProto.FLOAT,
                                     onnx.AttributeProto.GRAPH, onnx.AttributeProto.TENSOR))
        attribute.s = values.string().encode("utf-8", "surrogateescape")
        attribute.f = rng.choice((math.nan, math.inf))
    else:
        node.attribute.remove(attribute)
    return f"attribute {attribute.name if attribute else name!r} of {node.name!r}: {kind}"


def _op(model: onnx.ModelProto, values: Values, name: str) -> str:
    """A node's op type (one with subgraphs it lacks, an unknown one) or domain changed."""
    rng = values.rng
    node = rng.choice(model.graph.node)
    if rng.random() < 0.5:
        node.op_type = rng.choice((name, "Loop", "If", "Scan", "Identity", "Custom", "LayerNormalization"))
    else:
        node.domain = rng.choice((name, "com.microsoft", "ai.onnx.ml", "ai.onnx.preview.training", "evil"))
    return f"node {node.name!r}: op {node.op_type!r} domain {node.domain!r}"


def _declared(model: onnx.ModelProto, values: Values, name: str) -> str:
    """A graph input's or output's declared dims, rank or element type changed, or its type removed."""
    rng, graph = values.rng, model.graph
    value = rng.choice([*graph.input, *graph.output])
    tensor_type = value.type.tensor_type
    kind = rng.choice(("dim", "dim", "rank", "elem", "none"))
    if kind == "dim" and tensor_type.shape.dim:
        dim = rng.choice(tensor_type.shape.dim)
        if rng.random() < 0.6:
            dim.dim_value = rng.choice((0, -5, 1 << 40, 2**63 - 1, 3))
        else:
            dim.dim_param = name
    elif kind == "rank":
        tensor_type.shape.ClearField("dim")
        for _ in range(rng.choice((0, 1, 9, 64))):
            tensor_type.shape.dim.add().dim_value = rng.choice((1, 2, 1 << 20))
    elif kind == "elem":
        tensor_type.elem_type = rng.choice((0, 2, 7, 8, 9, 10, 16, 17, 21, 23, 26, 99))
    else:
        value.ClearField("type")
    return f"{value.name!r}: declared {kind} -> {short(str(value.type).strip(), 120)}"


def _opset(model: onnx.ModelProto, values: Values, name: str) -> str:
    """The opset version, the IR version, or an opset of another domain."""
    rng = values.rng
    kind = rng.choice(("opset", "ir", "domain"))
    if kind == "opset":
        model.opset_import[0].version = rng.choice((0, 1, 5, 999, 2**62))
    elif kind == "ir":
        model.ir_version = rng.choice((0, 1, 3, 11, 99, 2**62))
    else:
        model.opset_import.append(helper.make_opsetid(name, rng.choice((1, 999))))
    return f"{kind}: {short(str(model.opset_import).strip())} ir {model.ir_version}"


def _external(model: onnx.ModelProto, values: Values, name: str) -> str:
    """An initializer read from external data: outside the bundle, a device, the bundle's own files."""
    rng = values.rng
    tensor = rng.choice(model.graph.initializer)
    location = fill(rng.choice(("../../outside/victim", "{OUTSIDE}/victim", "/etc/passwd", "/dev/zero", "..",
                                "model.onnx", "report.json", "inputs.npz", "missing.bin", "", "/proc/self/mem",
                                "a\nb")), values.places)
    for data in ("raw_data", "float_data", "double_data"):
        tensor.ClearField(data)
    tensor.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", str(rng.choice((0, 1 << 62, -1)))),
               ("length", str(rng.choice((4, 1 << 40, 0))))]
    for key, value in entries[: rng.randint(1, 3)]:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return f"initializer {tensor.name!r} external: {entries}"


def _metadata(model: onnx.ModelProto, values: Values, name: str) -> str:
    model.doc_string = name
    entry = model.metadata_props.add()
    entry.key, entry.value = _storable(values.string()), name
    return f"metadata {short(name)}"


def _function(model: onnx.ModelProto, values: Values, name: str) -> str:
    """A node calling a model-local function that calls itself."""
    model.functions.append(helper.make_function("local", "F", ["a"], ["b"],
                                                [helper.make_node("F", ["a"], ["b"], domain="local")],
                                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    model.opset_import.append(helper.make_opsetid("local", 1))
    node = values.rng.choice(model.graph.node)
    node.op_type, node.domain = "F", "local"
    del node.input[1:]
    del node.output[1:]
    node.ClearField("attribute")
    return f"node {node.name!r} calls a function that calls itself"


def _subgraphs(model: onnx.ModelProto, values: Values, name: str) -> str:
    """A nest of If nodes (30 x 3 messages deep: protobuf reads 100; each level holds the one below once)."""
    inner = leaf = helper.make_graph([], "leaf", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
                                     [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])])
    depth = values.rng.choice((3, 30))
    for level in range(depth):
        node = helper.make_node("If", ["cond"], [f"o{level}"], then_branch=inner, else_branch=leaf)
        inner = helper.make_graph([node], f"g{level}", [],
                                  [helper.make_tensor_value_info(f"o{level}", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    model.graph.node.extend(inner.node)
    model.graph.initializer.extend(inner.initializer)
    return f"a nest of If subgraphs {depth} deep"


#: The model's mutations by name, each ``(model, values, a hostile name) -> what was done``.
MODEL_MUTATIONS: dict[str, Callable[[onnx.ModelProto, Values, str], str]] = {
    "rename": _rename, "attribute": _attribute, "op": _op, "declared": _declared, "opset": _opset,
    "external": _external, "metadata": _metadata, "function": _function, "subgraphs": _subgraphs}



# ------------------------------------------------------------------------------------------------ a case
@dataclass
class Case:
    """One fuzz case: a mutated copy of a bundle, and the commands to run on it."""

    number: int
    family: str
    source: str  # which bundle it was made from
    mutation: str
    target: Path  # the bundle folder or zip the commands are given
    bundle: Path | None  # the folder (repro.py runs there), None for a zip
    original: Path | None  # verify --model ORIGINAL
    expected_damage: bool = False
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"case {self.number} [{self.family} of {self.source}]: {self.mutation}"


def make_case(number: int, seed: int, bundles: dict[str, Path], work: Path, places: dict[str, str]) -> Case:
    """Case ``number`` of the run seeded ``seed``: a copy of one of ``bundles`` in ``work``, mutated."""
    rng = random.Random(f"{seed}:{number}")
    family = FAMILIES[number % len(FAMILIES)]
    source = sorted(bundles)[(number // len(FAMILIES)) % len(bundles)]
    values = Values(rng, places)
    bundle = work / "bundle"
    shutil.copytree(bundles[source], bundle)
    original: Path | None = None
    rehashed = rng.random() < 0.85
    if family in ("report", "report-shape"):
        text, mutation, top = mutate_json_text((bundle / "report.json").read_text(), values,
                                               schema=REPORT_SCHEMA, shaped=family == "report-shape")
        write_text(bundle / "report.json", text)
        if top in ("oracle", "target", "tolerance") or rng.random() < 0.1:  # what verify --model reads too
            original = work / "original.onnx"
            shutil.copyfile(bundles[source] / "model.onnx", original)
    elif family == "repro-config":
        text, mutation, _ = mutate_json_text((bundle / "repro_config.json").read_text(), values)
        write_text(bundle / "repro_config.json", text)
        if rehashed:
            rehash(bundle, "repro_config.json")
    elif family == "npz":
        name = rng.choice(("inputs.npz", "oracle_outputs.npz", "target_outputs.npz"))
        if not (bundle / name).exists():
            name = "inputs.npz"
        mutation = f"{name}: {mutate_npz(bundle / name, values)}"
        if rehashed:
            rehash(bundle, name)
    elif family == "model":
        mutation = mutate_model(bundle / "model.onnx", values)
        if rehashed:
            rehash(bundle, "model.onnx")
    else:
        archive = work / "bundle.zip"
        mutation = zip_bundle(bundle, archive, rng, places)
        shutil.rmtree(bundle)
        return Case(number, family, source, mutation, archive, None, None)
    if family not in ("report", "report-shape") and not rehashed:
        mutation += " (not rehashed)"
    return Case(number, family, source, mutation, bundle, bundle, original)


# ------------------------------------------------------------------------------------------------ the sandbox
def make_markers(folder: Path) -> tuple[Path, Path]:
    """A folder of marker programs (:data:`MARKED_PROGRAMS`) and the folder each run of one writes a file into."""
    bin_, marks = folder / "bin", folder / "marks"
    bin_.mkdir(parents=True)
    marks.mkdir()
    for name in MARKED_PROGRAMS:
        program = bin_ / name
        program.write_text(f'#!/bin/sh\necho "{name} $*" > "{marks}/{name}.$$"\nexit 1\n')
        program.chmod(0o755)
    return bin_, marks


Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every entry below ``root``: kind, size, mtime and mode (links: their target), not followed."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("dir", info.st_mode)
            else:
                found[key] = ("file", info.st_size, info.st_mtime_ns, info.st_mode)
    return found


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    return sorted(key for key in before.keys() | after.keys()
                  if before.get(key) != after.get(key) and not (before.get(key, ("",))[0] == "dir" and
                                                               after.get(key, ("",))[0] == "dir"))


# ------------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class Ran:
    """One command's end."""

    code: int
    output: str
    maxrss_kb: int
    timed_out: bool
    seconds: float


class ForkServer:
    """``fuzz_server.py`` started once, under the memory cap; :meth:`run` runs one command in a forked child."""

    def __init__(self, log: Path, address_space: int) -> None:
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuzz_server.py")),
                                          str(address_space)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        ready = self._answer(120)
        assert "ready" in ready, ready

    def _answer(self, timeout: float) -> dict[str, Any]:
        import select

        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            raise RuntimeError(f"the fuzz server did not answer: {self.log.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, kind: str, argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float,
            outputs: Path) -> Ran:
        assert self.proc.stdin is not None
        stdout, stderr = Path(f"{outputs}.out"), Path(f"{outputs}.err")
        self.proc.stdin.write(json.dumps({"kind": kind, "argv": argv, "cwd": str(cwd), "env": env,
                                          "stdout": str(stdout), "stderr": str(stderr), "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(timeout + 60)
        output = stdout.read_text(errors="replace") + stderr.read_text(errors="replace")
        return Ran(answer["code"], output, answer["maxrss_kb"], answer["timed_out"], answer["seconds"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: What may change in a case's sandbox, with all below it: the bundle's copy, the temp folder, the outputs named
#: on the command line, and what the backend libraries write under HOME by themselves (docs/security.md): ONNX
#: Runtime's telemetry, Paddle's dataset cache (a bundle whose target is ``paddle`` has Paddle imported).
ALLOWED_UNDER = ("work/bundle", "tmp", "work/verify.json", "work/audit.json",
                 "home/.cache/Microsoft/DeveloperTools/.onnxruntime", "home/.cache/paddle")
#: ... and the folders above those.
ALLOWED_FOLDERS = ("home/.cache", "home/.cache/Microsoft", "home/.cache/Microsoft/DeveloperTools")
#: Programs a backend library starts by itself, as the marker records them: Paddle reads the CPU's features
#: with ``cat /proc/cpuinfo`` when it is imported.
LIBRARY_PROGRAMS = frozenset({"cat /proc/cpuinfo"})

#: Exit codes each command may end with: verify's 4 is "fixed on the reduced model only".
ALLOWED_CODES = {"verify": {0, 1, 2, 4}, "audit": {0, 1, 2}, "repro.py": {0, 1, 2}}

#: Lines that say a run hit the address-space cap rather than refusing what it was given first.
OUT_OF_MEMORY = ("MemoryError", "out of memory", "std::bad_alloc", "Cannot allocate memory")


def _allowed(path: str) -> bool:
    return path in ALLOWED_FOLDERS or any(path == place or path.startswith(place + "/") for place in ALLOWED_UNDER)


def broken_rules(name: str, ran: Ran, *, timeout: float, memory_kb: int) -> list[str]:
    """The rules one run of ``name`` (verify, audit, repro.py) broke: its exit code, a traceback, its time, its
    memory."""
    found = []
    tail = ran.output[-1500:]
    if ran.timed_out:
        found.append(f"{name} ran past {timeout:.0f} s:\n{tail}")
    elif ran.code not in ALLOWED_CODES[name]:
        found.append(f"{name} exited {ran.code}:\n{tail}")
    if "Traceback (most recent call last)" in ran.output:
        found.append(f"{name} printed a traceback:\n{ran.output[-3000:]}")
    if ran.maxrss_kb > memory_kb:
        found.append(f"{name} took {ran.maxrss_kb // 1024} MB (cap {memory_kb // 1024} MB)")
    hit = [line for line in ran.output.splitlines() if any(word in line for word in OUT_OF_MEMORY)]
    if hit:
        found.append(f"{name} ran out of its address space instead of refusing first: {hit[:3]}")
    return found


class Sandbox:
    """A case's folders: ``home`` (HOME), ``tmp`` (TMPDIR), ``work`` (the working folder, with the bundle's
    copy), ``outside`` (what hostile paths name: nothing may write there), ``logs`` (the runs' stdout and
    stderr, the fuzzer's); and what a run wrote and started."""

    def __init__(self, root: Path, bin_: Path, marks: Path) -> None:
        self.root, self.bin, self.marks = root, bin_, marks
        for name in ("home", "tmp", "work", "outside", "logs"):
            (root / name).mkdir()
        (root / "outside" / "victim").write_text("the user's own file\n")
        self.places = {"OUTSIDE": str(root / "outside"), "BIN": str(bin_)}
        self.env = {**os.environ, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
                    "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._before = snapshot(root)
        self._marked = set(os.listdir(marks))

    def rebase(self) -> None:
        """What the sandbox holds now is where the runs start from (the case's files are not a run's)."""
        self._before = snapshot(self.root)

    @property
    def work(self) -> Path:
        return self.root / "work"

    def broken_rules(self) -> list[str]:
        """Files written where no run may write, and marker programs started, since the sandbox was made."""
        found = []
        written = [path for path in changed(self._before, snapshot(self.root))
                   if not _allowed(path) and not path.startswith("logs/")]
        if written:
            found.append(f"written outside the bundle's copy, the temp folder and the named outputs: {written[:10]}")
        started = [(self.marks / m).read_text().strip() for m in sorted(set(os.listdir(self.marks)) - self._marked)]
        started = [line for line in started if line not in LIBRARY_PROGRAMS]
        if started:
            found.append("started programs: " + "; ".join(line[:200] for line in started))
        return found


def run_case(server: ForkServer, case: Case, sandbox: Sandbox, *, timeout: float,
             memory_kb: int) -> tuple[list[str], dict[str, Ran]]:
    """Run verify, audit and (on a folder) repro.py on ``case``: every rule a run broke, and each run."""
    work = sandbox.work
    commands: list[tuple[str, str, list[str]]] = [
        ("verify", "graphbisect", ["verify", str(case.target), "--json", str(work / "verify.json"),
                                   *(["--model", str(case.original)] if case.original else [])]),
        ("audit", "graphbisect", ["audit", str(case.target), "--json", str(work / "audit.json")])]
    if case.bundle is not None:
        commands.append(("repro.py", "script", [str(case.bundle / "repro.py")]))
    found: list[str] = []
    runs: dict[str, Ran] = {}
    for name, kind, argv in commands:
        runs[name] = ran = server.run(kind, argv, cwd=work, env=sandbox.env, timeout=timeout,
                                      outputs=sandbox.root / "logs" / name)
        found += broken_rules(name, ran, timeout=timeout, memory_kb=memory_kb)
    return found + sandbox.broken_rules(), runs
