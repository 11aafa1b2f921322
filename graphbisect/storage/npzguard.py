"""Limits before reading an ``.npz``: what its members would take is known before any is decompressed.

An ``.npz`` is a zip of ``.npy`` members, and both say how large they are before their data is read: the
zip's central directory lists the members (and each one's size), each ``.npy`` header declares its dtype and
shape in its first bytes. Reading without looking first let a 2 MB deflate bomb (a member declaring
1×2^29 float32 zeros) be decompressed in full, 2.1 GB, before anything noticed that the model declares that
input ``[4, 4]`` (issue 24 for ``--inputs``, issue 36 for bundles, ``repro.py`` and a ``command`` target's
outputs). So every reader asks :func:`npz_refusal` first, which reads only the central directory and each
member's header (a few KiB of it decompressed), and refuses:

* more than :data:`MAX_NPZ_MEMBERS` members (counted in the central directory itself, without building an
  entry per member: 100,000 empty members took seconds to list);
* a member larger than :data:`SMALL_BYTES` whose shape does not fit what the model declares for the value it
  names — rank and every static dimension, also in a partly dynamic shape (``[n, 4]`` refuses ``(1, 2^29)``
  by its 4) — or that names no value the model declares (a small one is left to the readers' own checks,
  which say more: a wrong shape is compared, an unknown input named);
* a member whose header declares more data than the member holds (numpy would allocate it first);
* members that would take more than the memory available here, all together.

One rule for every reader: :func:`graphbisect.storage.values.load_values_npz` applies it (so every ``.npz``
graphbisect reads has the member and memory caps) with the model's declared shapes where the caller knows
them (user inputs, a bundle's files, a ``command`` target's outputs). ``repro.py``, which must run without
graphbisect, embeds this module's code (``embedded_source``), as it embeds :mod:`graphbisect.oracle.names`.
This module therefore imports only the standard library and numpy.

Example:
    >>> import io, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> np.savez(path, x=np.zeros((1, 70000), np.float32))
    >>> npz_refusal(path, {"x": (None, 4)})
    "member 'x.npy' declares float32 (1, 70000) (273.4 KB), but the model declares 'x' as [?, 4]"
    >>> npz_refusal(path, {"x": (None, 70000)}) is None
    True
"""

from __future__ import annotations

import json
import logging
import lzma
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

#: Members an ``.npz`` may hold: one per tensor (a sequence's items each have one).
MAX_NPZ_MEMBERS = 1 << 16
#: Members a bundle's ``.zip`` may hold (a bundle is a dozen files and a few charts).
MAX_BUNDLE_MEMBERS = 1000
#: A member up to this size is read whatever its shape: the readers' own checks say more about it.
SMALL_BYTES = 64 << 10
#: The largest ``__values__.json`` manifest read (an entry per value is a few hundred bytes).
MANIFEST_MAX_BYTES = 16 << 20
NPZ_MANIFEST = "__values__.json"
#: The compression methods Python's zipfile reads (numpy's ``savez`` stores, graphbisect's bundles deflate).
READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
                    zipfile.ZIP_LZMA: "lzma"}
#: What reading a damaged zip raises (beyond the ``OSError`` of a file that cannot be read): a wrong CRC, a cut or
#: broken stream or directory (``BadZipFile``, ``zlib.error``, ``lzma.LZMAError``, ``EOFError``), local-header
#: flags zipfile does not handle (``NotImplementedError``); a broken bzip2 stream raises a plain ``OSError``
#: without an errno (:func:`damaged_stream`).
MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, NotImplementedError)


def damaged_stream(exc: BaseException) -> bool:
    """True when ``exc``, raised reading a zip member, says its bytes are damaged (:data:`MEMBER_ERRORS`, or the
    errno-less ``OSError("Invalid data stream")`` of bz2), not that the file system failed (an ``OSError`` with
    an errno: no space, no permission), which is the machine's problem and is raised as it is."""
    return isinstance(exc, MEMBER_ERRORS) or (isinstance(exc, OSError) and exc.errno is None)


def member_unreadable(info: zipfile.ZipInfo) -> str | None:
    """Why Python's zipfile cannot read the zip member ``info`` at all, which its entry says before it is read,
    or None: it is encrypted (``RuntimeError: ... password required``) or compressed with a method zipfile does
    not read (93, Zstandard: ``NotImplementedError``). Both ended in "a graphbisect bug" (issue 36 item 7)."""
    if info.flag_bits & 0x1:
        return f"member {info.filename!r} is encrypted"
    if info.compress_type not in READABLE_METHODS:
        return (f"member {info.filename!r} is compressed with method {info.compress_type}, which Python's zipfile "
                f"does not read (it reads {', '.join(READABLE_METHODS.values())})")
    return None


def zip_member_count(path: str | os.PathLike[str], limit: int) -> int | None:
    """The members the zip at ``path`` lists in its central directory, counted up to ``limit + 1`` (past that
    the count stops); None when ``path`` is not a zip (its reader's own error then says so).

    Why not ``len(zipfile.ZipFile(path).infolist())``: that builds an entry per member first (100,000 empty
    members took 3 s and 80 MB before the count could refuse them).
    """
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        tail_length = min(size, 22 + 0xFFFF)
        handle.seek(size - tail_length)
        tail = handle.read(tail_length)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            return None
        cd_size = struct.unpack("<L", tail[at + 12:at + 16])[0]
        cd_end = size - tail_length + at
        if at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":  # zip64: its record precedes the locator
            handle.seek(max(cd_end - 20 - 56, 0))
            record = handle.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                cd_size = struct.unpack("<Q", record[40:48])[0]
                cd_end -= 20 + 56
        if cd_size > cd_end:
            return None
        handle.seek(cd_end - cd_size)
        count = done = 0
        while done < cd_size and count <= limit:
            head = handle.read(46)
            if len(head) < 46 or head[:4] != b"PK\x01\x02":
                break  # malformed: zipfile says how
            skip = sum(struct.unpack("<3H", head[28:34]))
            handle.seek(skip, os.SEEK_CUR)
            done += 46 + skip
            count += 1
        return count


def available_memory() -> int:
    """Bytes of memory this machine has available now (``MemAvailable``; else its physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return 1 << 62  # unknown: no limit


def size_text(n: int) -> str:
    """``n`` bytes for people: ``2.0 GB``."""
    for unit, size in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def dims_text(dims: Sequence[int | None]) -> str:
    """A declared shape as the model writes it: ``[?, 4]`` (``?``: a dynamic dimension)."""
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def shape_fits(shape: Sequence[int], dims: Sequence[int | None]) -> bool:
    """Whether an array's ``shape`` fits the declared ``dims`` (None: dynamic): same rank, every static
    dimension equal."""
    return len(shape) == len(dims) and all(d is None or d == s for s, d in zip(shape, dims))


def dtype_text(dtype: np.dtype) -> str:
    """A value's dtype as :func:`type_problem` compares it with the model's: its name (``float64``, ``bfloat16``),
    ``string`` for every string kind numpy has (``object``, unicode, bytes)."""
    return "string" if dtype.kind in "OUS" else dtype.name


def type_problem(values: Mapping[str, Any], dtypes: Mapping[str, str]) -> str | None:
    """The first tensor in ``values`` whose dtype is not the one the model declares for it, as a sentence, or
    None: ``dtypes`` is {input name: :func:`dtype_text` of the declared element type}. Bytes for a double input
    reached a worker (``audit``: a UnicodeDecodeError, "a graphbisect bug"; issue 36, the bundle fuzzer)."""
    for name, expected in dtypes.items():
        value = values.get(name)
        if isinstance(value, np.ndarray) and dtype_text(value.dtype) != expected:
            return (f"input {name!r} holds values of dtype {value.dtype.str} ({dtype_text(value.dtype)}), but "
                    f"model.onnx declares it {expected}")
    return None


def npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype] | None:
    """``(shape, dtype)`` from the ``.npy`` header at the start of ``stream`` (reading only the header), or None
    when it is not one numpy reads without pickles' help (numpy's own error then says what it is)."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            return None
    except Exception:  # a broken header: whatever numpy raises, np.load raises it again, with its message
        return None
    return tuple(int(d) for d in shape), dtype


def manifest_owners(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[dict[str, str], set[str]]:
    """{member: value name} of the values an ``__values__.json`` member describes (bfloat16, strings,
    sequences...), and the names of those stored as one member of their own shape."""
    if info.file_size > MANIFEST_MAX_BYTES:
        raise ValueError(f"its {NPZ_MANIFEST} would decompress to {size_text(info.file_size)}, more than the "
                         f"{size_text(MANIFEST_MAX_BYTES)} a description of its values takes")
    try:
        described = json.loads(archive.read(info))["values"]
        items = list(described.items())
    except Exception:  # unreadable: its reader says so
        return {}, set()
    owners: dict[str, str] = {}
    whole: set[str] = set()

    def files(name: str, entry: Any) -> None:
        if not isinstance(entry, dict):
            return
        if isinstance(entry.get("file"), str):
            owners[entry["file"]] = name
        for item in entry.get("sequence") or ():
            files(name, item)
        files(name, entry.get("optional"))

    for name, entry in items:
        files(name, entry)
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            whole.add(name)
    return owners, whole


def npz_refusal(path: str | os.PathLike[str], declared: Mapping[str, Sequence[int | None] | None] | None = None,
                cap: int | None = None, limit: int = MAX_NPZ_MEMBERS) -> str | None:
    """Why the ``.npz`` at ``path`` may not be read, or None: its members' sizes (their ``.npy`` headers)
    against ``declared`` ({value name: dims (None: dynamic) or None: any shape}; None: no model known),
    against ``cap`` bytes in all (default: the memory available) and their number against ``limit``.
    Decompresses only each member's header. See the module docstring for the rules."""
    count = zip_member_count(path, limit)
    if count is None:
        return None  # not a zip: numpy's own error names the file
    if count > limit:
        return f"it holds more than {limit} members (an .npz holds one per value)"
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None  # unreadable: numpy's own error says why
    with archive:
        infos = archive.infolist()
        owners: dict[str, str] = {}
        whole: set[str] = set()
        for info in infos:
            if info.filename == NPZ_MANIFEST:
                try:
                    owners, whole = manifest_owners(archive, info)
                except ValueError as exc:
                    return str(exc)
        total = 0
        for info in infos:
            if info.filename == NPZ_MANIFEST:
                total += info.file_size
                continue
            try:
                with archive.open(info) as stream:
                    header = npy_header(stream)
            except Exception:  # encrypted, an unknown compression...: its reader says so
                header = None
            if header is None:
                total += info.file_size
                continue
            shape, dtype = header
            what = f"member {info.filename!r} declares {dtype} {shape}"
            nbytes = info.file_size if dtype.hasobject else math.prod(shape) * dtype.itemsize
            if nbytes > info.file_size:
                return (f"{what} ({size_text(nbytes)}), but holds only {size_text(info.file_size)}: it is "
                        "truncated or forged")
            total += nbytes
            if declared is None or nbytes <= SMALL_BYTES:
                continue
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            name = owners.get(info.filename, key)
            if name not in declared:
                return (f"{what} ({size_text(nbytes)}), but the model declares no value named {name!r} "
                        f"(it declares {', '.join(map(repr, list(declared)[:8])) or 'none'})")
            dims = declared[name]
            if dims is not None and (name == key or name in whole) and not shape_fits(shape, dims):
                return f"{what} ({size_text(nbytes)}), but the model declares {name!r} as {dims_text(dims)}"
        cap = available_memory() if cap is None else cap
        if total > cap:
            return (f"its members decompress to {size_text(total)}, more than the {size_text(cap)} of memory "
                    "available here")
    return None


# ---- end of what a standalone script embeds (embedded_source): graphbisect's own helpers follow


logger = logging.getLogger(__name__)


def value_dims(value_info: Any) -> tuple[int | None, ...] | None:
    """The dims an ONNX ``ValueInfoProto`` declares (None for a dynamic dimension), or None when it declares no
    tensor shape (untyped, a sequence, no shape)."""
    tensor = value_info.type.tensor_type if value_info.type.HasField("tensor_type") else None
    if tensor is None or not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tensor.shape.dim)


Dims = tuple[int | None, ...] | None

#: Seconds ONNX's shape inference may take on a model from outside graphbisect, in its child process.
INFER_TIMEOUT = 60.0

#: What that child runs: the model file's outputs as inferred, written to stdout as a GraphProto holding only
#: them. Not the current folder on ``sys.path`` first (an ``onnx.py`` beside the user must not be imported).
_INFER_SCRIPT = (
    "import sys\n"
    "del sys.path[0]\n"
    "import onnx\n"
    "model = onnx.load(sys.argv[1], load_external_data=False)\n"
    "outputs = onnx.shape_inference.infer_shapes(model).graph.output\n"
    "sys.stdout.buffer.write(onnx.helper.make_graph([], 'outputs', [], list(outputs)).SerializeToString())\n")


def inferred_outputs(path: str | os.PathLike[str], timeout: float = INFER_TIMEOUT) -> list[Any]:
    """The ``ValueInfoProto`` of each output ONNX's shape inference gives the model file ``path``, inferred in a
    child process; [] when it cannot say (an error, a crash, past ``timeout`` seconds: a warning says which).

    Why a child: ONNX's shape inference is C++ that trusts the model it is given. On a bundle's model (a
    download) it died of SIGSEGV in graphbisect's own process, before a word, on a ``Scan`` node without its
    body and on a local function that calls itself (issue 36, found by the bundle fuzzer). In a child such a
    crash costs only the inferred shapes: those outputs are then held to the memory cap alone.
    """
    import signal
    import subprocess
    import sys

    import onnx

    what = f"ONNX's shape inference of {os.fspath(path)!r}"
    try:
        done = subprocess.run([sys.executable, "-c", _INFER_SCRIPT, os.fspath(path)], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        logger.warning("%s ran past %.0f s: its outputs declared without a shape are held to the memory cap alone",
                       what, timeout)
        return []
    except OSError as exc:
        logger.warning("%s could not start (%s): its outputs declared without a shape are held to the memory cap "
                       "alone", what, exc)
        return []
    if done.returncode != 0:
        how = f"failed (exit {done.returncode})"
        if done.returncode < 0:
            try:
                how = f"died of {signal.Signals(-done.returncode).name}"
            except ValueError:
                how = f"died of signal {-done.returncode}"
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        logger.warning("%s %s%s: its outputs declared without a shape are held to the memory cap alone", what, how,
                       f" ({last[0][:300]!r})" if last[0] else "")
        return []
    try:
        return list(onnx.GraphProto.FromString(done.stdout).output)
    except Exception as exc:  # a child that wrote something else: no shapes from it
        logger.warning("%s wrote no readable answer (%s)", what, exc)
        return []


def model_declared(proto: Any, path: str | os.PathLike[str] | None = None) -> tuple[dict[str, Dims], dict[str, Dims]]:
    """({input: dims}, {output: dims}) an ONNX ``ModelProto`` declares (:func:`value_dims`), an output declared
    without a shape as ONNX's shape inference infers it from the inputs (a bundle's inputs are static, so its
    outputs' sizes are known before reading them).

    ``path``: the file ``proto`` was read from, when it comes from outside graphbisect (a bundle's model.onnx):
    the inference then runs in a child process (:func:`inferred_outputs`), never here. Without it (a model
    graphbisect built and has run through the same inference already) it runs here.
    """
    inputs = {v.name: value_dims(v) for v in proto.graph.input}
    outputs = {v.name: value_dims(v) for v in proto.graph.output}
    if any(dims is None for dims in outputs.values()):
        if path is not None:
            inferred = inferred_outputs(path)
        else:
            import onnx

            try:
                inferred = list(onnx.shape_inference.infer_shapes(proto).graph.output)
            except Exception:  # inference cannot say: those outputs are held to the memory cap alone
                inferred = []
        for value in inferred:
            if outputs.get(value.name, ()) is None:
                outputs[value.name] = value_dims(value)
    return inputs, outputs
