"""Loading models: ONNX files (with external data), ``ModelProto`` objects and Paddle inference models.

The user's files are only ever read. External data is checked before a byte of it is read: every
``location`` must stay inside the model's folder (no ``../``, no absolute paths), the file must exist and
be large enough for the tensor; each failure names the tensor, the location and the fix. Then large
external initializers stay on disk as source references (:mod:`graphbisect.model.external`): a model
with 10 GB of weights costs the main process its graph, not its weights. Smaller external tensors are
read into the model.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path, PureWindowsPath
from types import ModuleType

import onnx

from graphbisect.errors import GraphBisectError, ModelError
from graphbisect.model.external import LAZY_MIN_BYTES, make_source_stub, source_of
from graphbisect.model.graph import Model
from graphbisect.model.normalize import normalize_model, subgraphs
from graphbisect.storage.gcpause import gc_paused

__all__ = ["external_data_file", "external_tensors", "file_kind", "load_model", "outside_folder"]

logger = logging.getLogger(__name__)

_CORRUPT = "if it is an ONNX file, it is truncated or corrupt: re-export or re-download it"
_EXPECTED = "an ONNX model (.onnx) or a Paddle inference model (prefix, .pdmodel/.json + .pdiparams, or its folder)"

# Bytes per element of ONNX element types (fractions for packed sub-byte types).
_ITEM_SIZE: dict[int, float] = {
    **dict.fromkeys((2, 3, 9), 1),  # UINT8, INT8, BOOL
    **dict.fromkeys((4, 5, 10, 16), 2),  # UINT16, INT16, FLOAT16, BFLOAT16
    **dict.fromkeys((1, 6, 12), 4),  # FLOAT, INT32, UINT32
    **dict.fromkeys((7, 11, 13, 14), 8),  # INT64, DOUBLE, UINT64, COMPLEX64
    15: 16,  # COMPLEX128
    **dict.fromkeys((17, 18, 19, 20, 24), 1),  # float8 variants
    **dict.fromkeys((21, 22, 23), 0.5),  # 4-bit types
    **dict.fromkeys((25, 26), 0.25),  # 2-bit types
}


@gc_paused()
def load_model(source: str | Path | onnx.ModelProto, *, cache_dir: Path | None = None) -> Model:
    """Load and normalize a model from an ONNX file, a Paddle inference model or a ``ModelProto``.

    A ``ModelProto`` is copied, never modified. A Paddle model is converted with paddle2onnx into
    ``cache_dir`` (default ``$GRAPHBISECT_CACHE`` or ``~/.cache/graphbisect``), cached by content hash.
    Raises :class:`ModelError` naming the file and the problem (missing, not a model, truncated,
    unsupported opset, external data missing or outside the model's folder...).

    Example:
        >>> model = load_model("resnet50.onnx")      # doctest: +SKIP
        >>> model.opset, len(model.nodes)             # doctest: +SKIP
        (13, 122)
    """
    if isinstance(source, onnx.ModelProto):
        _check_in_memory_references(source)
        return Model(source)
    path = Path(source)
    paddle = _paddle_support()
    if paddle is not None and (_is_paddle(paddle, path) or _looks_like_paddle(path)):
        return _load_paddle(paddle, path, cache_dir)  # an incomplete Paddle model gets Paddle's own error
    if _looks_like_paddle(path):
        raise ModelError(
            f"{path} looks like a Paddle model, but Paddle support (graphbisect.model.paddle) is not available",
            hint="install it with pip install 'graphbisect[paddle]', or convert the model to ONNX with paddle2onnx",
        )
    _check_is_file(path)
    proto = _read_onnx(path)
    return Model(_normalize(proto, path), path=path, normalized=True)


# --- Paddle ----------------------------------------------------------------------------------------------


def _paddle_support() -> ModuleType | None:
    """The Paddle conversion module, imported lazily (the core works without Paddle)."""
    try:
        return importlib.import_module("graphbisect.model.paddle")
    except ImportError as exc:
        logger.debug("Paddle support unavailable: %s", exc)
        return None


def _is_paddle(paddle: ModuleType, path: Path) -> bool:
    try:
        return bool(paddle.is_paddle_model(path))
    except OSError as exc:
        logger.debug("cannot tell whether %s is a Paddle model: %s", path, exc)
        return False


def _looks_like_paddle(path: Path) -> bool:
    """A file-name-only check, used when graphbisect.model.paddle cannot be imported."""
    if path.suffix in (".pdmodel", ".pdiparams"):
        return True
    if path.is_dir():
        return any(path.glob("*.pdmodel")) or any(path.glob("*.pdiparams"))
    prefix = str(path.with_suffix("")) if path.suffix == ".json" else str(path)
    return Path(prefix + ".pdiparams").exists() or Path(str(path) + ".pdmodel").exists()


def _load_paddle(paddle: ModuleType, path: Path, cache_dir: Path | None) -> Model:
    onnx_path, prefix = paddle.convert_paddle_model(path, cache_dir=cache_dir)
    proto = _read_onnx(Path(onnx_path))
    return Model(_normalize(proto, Path(onnx_path)), path=onnx_path, paddle_source=prefix, normalized=True)


# --- ONNX files ----------------------------------------------------------------------------------------


def _check_is_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"model not found: {path}", hint=f"check the path; expected {_EXPECTED}")
    if path.is_dir():
        onnx_files = sorted(p.name for p in path.glob("*.onnx"))
        found = f" (it holds {', '.join(onnx_files[:3])})" if onnx_files else ""
        raise ModelError(f"{path} is a folder{found}", hint=f"pass a model file; expected {_EXPECTED}")
    if not path.is_file():  # a named pipe would block the read forever, a device would never end
        raise ModelError(f"{path} is not a regular file (a named pipe, socket or device)",
                         hint=f"save the model to a file first; expected {_EXPECTED}")


def _describe_content(path: Path) -> str:
    """A guess at what a file that is not an ONNX model is, for error messages."""
    with path.open("rb") as handle:
        head = handle.read(512)
    stripped = head.lstrip()
    if not head:
        return "the file is empty"
    if stripped[:1] in (b"{", b"["):
        return "it looks like a JSON file"
    if head.startswith(b"PK\x03\x04"):
        return "it looks like a zip archive (a PyTorch checkpoint or an .npz file?)"
    if head.startswith(b"\x93NUMPY"):
        return "it looks like a numpy .npy file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "it is binary data that is not an ONNX protobuf (or a truncated/corrupt one)"
    if all(ch.isprintable() or ch.isspace() for ch in text):
        return "it looks like a text file"
    return "it is binary data that is not an ONNX protobuf (or a truncated/corrupt one)"


def _read_onnx(path: Path) -> onnx.ModelProto:
    """Parse ``path`` (without external data), then check and load its external data."""
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(
            f"{path} is not a readable ONNX model: {_describe_content(path)} ({type(exc).__name__}: {exc})",
            hint=f"expected {_EXPECTED}; {_CORRUPT}",
        ) from exc
    graph = proto.graph
    if not proto.HasField("graph") or not (graph.node or graph.output):
        raise ModelError(
            f"{path} is not an ONNX model: it holds no graph ({_describe_content(path)})",
            hint=f"expected {_EXPECTED}; {_CORRUPT}",
        )
    _load_external_data(proto, path)
    return proto


def _normalize(proto: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    _check_tensor_names(proto.graph, path)
    try:
        return normalize_model(proto, copy=False)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc.message}", hint=exc.hint) from exc


def _check_tensor_names(graph: onnx.GraphProto, path: Path) -> None:
    """Refuse tensor names holding NUL up front: values cross process boundaries in ``.npz`` files, whose
    zip member names end at a NUL, so such a run would otherwise abort half-way ("no value for input")."""
    names = [*(v.name for v in graph.input), *(v.name for v in graph.output), *(i.name for i in graph.initializer),
             *(o for node in graph.node for o in node.output)]
    bad = [name for name in names if "\0" in name]
    if bad:
        raise ModelError(f"{path}: tensor {bad[0]!r} has a NUL character in its name"
                         + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                         hint="tensor values are exchanged as .npz files, which cannot hold NUL in a name: rename "
                         "them (e.g. name.replace('\\0', '_') on every node input/output and graph value)")


# --- external data -------------------------------------------------------------------------------------


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto stored in ``graph``: initializers, sparse initializers, attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield from (attribute.sparse_tensor.values, attribute.sparse_tensor.indices)
        for subgraph in subgraphs(node):
            yield from _all_tensors(subgraph)


def _check_in_memory_references(proto: onnx.ModelProto) -> None:
    """Refuse a ``ModelProto`` whose tensors reference external data by a relative path: relative to a folder
    it does not know, no backend could read them (it ran as "the oracle failed: External data path does not
    exist", with a hint to change the oracle). An absolute reference (graphbisect's own, or a user's) is kept.
    """
    for tensor in _model_tensors(proto):
        if _uses_external_data(tensor) and source_of(tensor) is None:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            raise ModelError(
                f"the ModelProto's tensor {tensor.name!r} keeps its data in the external file {location!r}, "
                "relative to a folder the ModelProto does not know",
                hint="pass the model's path instead (graphbisect reads the data beside it), or load it with "
                "onnx.load(path) so the data is in the ModelProto")


def _uses_external_data(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _model_tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _all_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Check every external-data reference of ``proto`` (relative to ``path``'s folder); keep the large
    top-level initializers on disk as source references and load the rest."""
    tensors = [t for t in _model_tensors(proto) if _uses_external_data(t)]
    if not tensors:  # most models: one walk over their tensors, not three
        return
    for tensor in tensors:  # check all before reading any
        _plan_read(tensor, path)
    kept = 0
    for tensor in proto.graph.initializer:
        if _uses_external_data(tensor):
            file, offset, length = _plan_read(tensor, path)
            if length is not None and length >= LAZY_MIN_BYTES:
                make_source_stub(tensor, file, offset, length)
                kept += length
    loaded = 0
    for tensor in _model_tensors(proto):
        if _uses_external_data(tensor) and source_of(tensor) is None:
            file, offset, length = _plan_read(tensor, path)
            with file.open("rb") as handle:
                handle.seek(offset)
                tensor.raw_data = handle.read() if length is None else handle.read(length)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
            loaded += 1
    logger.info("%s: %d external tensors loaded, %d bytes of external weights kept on disk", path, loaded, kept)


def _expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    item_size = _ITEM_SIZE.get(tensor.data_type)
    if item_size is None:
        return None
    return math.ceil(math.prod(tensor.dims) * item_size)


def external_data_file(tensor: onnx.TensorProto, path: Path, *,
                       error: type[GraphBisectError] = ModelError) -> Path:
    """The file holding the external data of ``tensor``, stored in the file ``path`` (a model or a ``.pb``).

    Its ``location`` must be relative and stay inside ``path``'s folder, also after following symbolic
    links, and not be a hard link to another owner's file; raises ``error`` naming the tensor and the location
    otherwise. Existence is not checked.
    """
    location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
    _check_location(tensor, location, path, error)
    file = path.parent / location
    _check_real_location(tensor, location, file, path, error)
    _check_hard_link(tensor, location, file, path, error)
    return file


def _check_hard_link(tensor: onnx.TensorProto, location: str, file: Path, path: Path,
                     error: type[GraphBisectError]) -> None:
    """A hard link inside the folder may be any file of the same file system: unlike a symbolic link it names
    no target to check. One owned by someone else than the model file's owner is refused (issue 24: a planted
    ``w.bin`` linked to another user's file put that file into a bundle). A link between one owner's files
    is theirs to make (graphbisect's own work folders hard-link the user's weights rather than copy them)."""
    try:
        info, model = file.stat(), path.stat()
    except OSError:
        return  # missing: said by the size check, with the file's name
    if info.st_nlink > 1 and info.st_uid != model.st_uid and not file.is_dir():
        raise error(
            f"{path}: external data of tensor {tensor.name!r} (location {location!r}) is a hard link to a file of "
            f"another owner (uid {info.st_uid}, the model's is {model.st_uid}): it may be any file of this file "
            "system, which would end up in a bundle; graphbisect refuses to read it",
            hint=f"if it is the model's data, copy it instead of linking it (cp --remove-destination SOURCE {file})")


def _check_location(tensor: onnx.TensorProto, location: str, path: Path,
                    error: type[GraphBisectError] = ModelError) -> None:
    if not location:
        raise error(
            f"{path}: tensor {tensor.name!r} is stored as external data but names no file (empty location)",
            hint="the model is corrupt; re-export it",
        )
    normalized = posixpath.normpath(location.replace("\\", "/"))
    if (
        os.path.isabs(location)
        or normalized.startswith("/")
        or PureWindowsPath(location).drive
        or normalized == ".."
        or normalized.startswith("../")
    ):
        raise error(
            f"{path}: tensor {tensor.name!r} stores its external data outside the model's folder "
            f"(location {location!r}); graphbisect refuses to read it",
            hint="keep external data files in the model's folder (or below) and store relative locations, "
            "e.g. re-save with onnx.save_model(model, path, save_as_external_data=True, location='model.onnx.data')",
        )


def _check_real_location(tensor: onnx.TensorProto, location: str, file: Path, path: Path,
                         error: type[GraphBisectError] = ModelError) -> None:
    """The data file, after following symbolic links, must lie inside the model's folder (as onnx requires).

    A text check alone lets ``leak.bin -> /etc/passwd`` (or a linked folder) beside a model put any local
    file's bytes into a bundle's model and outputs. When the model file itself is a link (a Hugging Face
    cache snapshot links every file to a blob folder), its data may also lie in the folder it links to.
    """
    outside = outside_folder(file, path.parent)
    if outside is not None and path.is_symlink():
        outside = outside_folder(file, Path(os.path.realpath(path)).parent)
    if outside is not None:
        raise error(
            f"{path}: external data of tensor {tensor.name!r} (location {location!r}) is a symbolic link to "
            f"{outside}, outside the folder of {path.name}; graphbisect refuses to read it",
            hint=f"copy the data file into {path.parent} instead of linking it",
        )


def outside_folder(file: Path, folder: Path) -> Path | None:
    """Where ``file`` really is (symbolic links followed) when that is outside ``folder``'s real path, else None.

    Example:
        >>> outside_folder(Path("/tmp/m/w.bin"), Path("/tmp/m")) is None   # doctest: +SKIP
        True
    """
    real = Path(os.path.realpath(file))
    root = Path(os.path.realpath(folder))
    return None if real == root or root in real.parents else real


def file_kind(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (symbolic links followed): ``"missing"``, ``"a folder"``,
    ``"a named pipe"``, ``"a character device"``, ``"a block device"``, ``"a socket"``; None for a regular file.

    Example:
        >>> file_kind(Path("/dev/null")), file_kind(Path("/")), file_kind(Path("/no/such/file"))
        ('a character device', 'a folder', 'missing')
    """
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return "missing"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of ``proto`` (initializers, attributes, subgraphs, functions) that keeps its data in an
    external file."""
    return [tensor for tensor in _model_tensors(proto) if _uses_external_data(tensor)]


def _plan_read(tensor: onnx.TensorProto, path: Path) -> tuple[Path, int, int | None]:
    """Validate one external-data reference; returns (file, offset, length or None for 'to the end')."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    file = external_data_file(tensor, path)
    kind = file_kind(file)
    if kind == "missing":
        raise ModelError(
            f"{path}: external data of tensor {tensor.name!r} is missing: expected the file {file}",
            hint=f"copy {location!r} next to the model file (external data is resolved relative to the "
            "model's folder), or load the model from the folder that holds its data",
        )
    if kind is not None:  # a named pipe would block the read, a device never end: it was called "missing"
        raise ModelError(
            f"{path}: external data of tensor {tensor.name!r} (location {location!r}) is {kind}, not a file; "
            "graphbisect refuses to read it",
            hint=f"put the model's data file at {file} (external data is a regular file beside the model)",
        )
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError as exc:
        raise ModelError(
            f"{path}: tensor {tensor.name!r} has a non-integer external data offset/length ({info})",
            hint="the model is corrupt; re-export it",
        ) from exc
    _check_size(tensor, file, offset, length, path)
    return file, offset, length if length is not None else _expected_nbytes(tensor)


def _check_size(tensor: onnx.TensorProto, file: Path, offset: int, length: int | None, path: Path) -> None:
    expected = _expected_nbytes(tensor)
    if length is not None and expected is not None and length != expected:
        raise ModelError(
            f"{path}: tensor {tensor.name!r} declares {length} bytes of external data, but its shape "
            f"{list(tensor.dims)} and type need {expected}",
            hint="the model and its data file do not match; re-export them together",
        )
    needed = length if length is not None else expected or 0
    size = file.stat().st_size
    if offset < 0 or offset + needed > size:
        raise ModelError(
            f"{path}: external data file {file.name} is too small for tensor {tensor.name!r}: it needs bytes "
            f"{offset}..{offset + needed} but the file has {size} bytes",
            hint="the data file is truncated or belongs to another version of the model; "
            "re-download or re-export the model and its data together",
        )
