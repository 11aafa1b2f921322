"""Paddle inference models: recognize them, find their files, convert them to ONNX (cached).

A Paddle inference model is a model file plus a parameters file sharing one stem:

* ``<stem>.json`` (PIR program, Paddle ≥ 3.0; its first bytes hold ``"magic":"pir"``) or
  ``<stem>.pdmodel`` (legacy ProgramDesc protobuf), and
* ``<stem>.pdiparams`` (the weights).

Users name it by its folder (``model_dir/``), its path prefix (``model_dir/inference``) or either file.
When both a ``.json`` and a ``.pdmodel`` exist for one stem, the PIR ``.json`` wins (it is what Paddle 3
loads first).

Conversion runs paddle2onnx in a **child process** (``sys.executable``): paddle2onnx reports a failure by
printing it and calling ``sys.exit(-1)``, its C++ core can abort or segfault on unsupported programs, and
importing Paddle costs seconds and changes process-wide state (flags, signal handlers). A child process
turns all of that into an exit code plus a log we can quote, and the host never imports Paddle. The ONNX
bytes are cached by content (sha256 of model + params bytes, opset and paddle2onnx version), so a second
load of the same model never converts again. Nothing is ever written next to the user's files.

Example:
    >>> from pathlib import Path
    >>> is_paddle_model(Path("/nonexistent/inference"))
    False
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.errors import ModelError

__all__ = [
    "DEFAULT_OPSET",
    "PaddleOp",
    "cache_root",
    "convert_paddle_model",
    "is_paddle_model",
    "program_ops",
    "resolve_paddle_model",
]

logger = logging.getLogger(__name__)

#: ONNX opset asked of paddle2onnx when none is given. paddle2onnx's own Python default (7, raised on
#: demand) produces dated op versions; 17 is understood by every backend graphbisect drives and has
#: LayerNormalization. paddle2onnx still raises it when an operator needs more (auto_upgrade_opset).
DEFAULT_OPSET = 17

#: Seconds a conversion may take before it is abandoned (large models take minutes, not hours).
CONVERT_TIMEOUT_S = 3600.0

MODEL_SUFFIXES = (".json", ".pdmodel")  # in order of preference
PARAMS_SUFFIX = ".pdiparams"
_PIR_MAGIC = re.compile(rb'"magic"\s*:\s*"pir"')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+")
# Folder layouts tried before scanning: what paddle.jit.save / PaddleX / PaddleOCR write.
_PREFERRED_STEMS = ("inference", "model")

# Runs in a child interpreter: argv = model_file params_file out_file opset.
# paddle2onnx.export(save_file=None) returns the serialized ModelProto; on failure it prints
# "[ERROR] Failed to convert PaddlePaddle model: ..." to stdout and calls sys.exit(-1).
_CONVERT_SCRIPT = """\
import sys
import paddle2onnx
model_file, params_file, out_file, opset = sys.argv[1:5]
data = paddle2onnx.export(model_file, params_file, None, opset_version=int(opset),
                          auto_upgrade_opset=True, verbose=False, enable_onnx_checker=True)
if not data:
    sys.stderr.write("paddle2onnx returned no model\\n")
    sys.exit(3)
with open(out_file, "wb") as f:
    f.write(data)
"""


def _is_model_file(path: Path) -> bool:
    """Whether ``path`` is a Paddle program file: a ``.pdmodel``, or a ``.json`` carrying the PIR magic."""
    if not path.is_file():
        return False
    if path.suffix == ".pdmodel":
        return True
    if path.suffix == ".json":
        try:
            with path.open("rb") as f:
                head = f.read(512)
        except OSError:
            return False
        return _PIR_MAGIC.search(head) is not None
    return False


def _candidates_in_folder(folder: Path) -> list[Path]:
    """Program files in ``folder`` that have a sibling ``.pdiparams``, best first."""
    found: list[Path] = []
    rank = {stem: i for i, stem in enumerate(_PREFERRED_STEMS)}
    stems = sorted(
        {p.stem for p in folder.iterdir() if p.suffix in MODEL_SUFFIXES},
        key=lambda stem: (rank.get(stem, len(rank)), stem),
    )
    for stem in stems:
        for suffix in MODEL_SUFFIXES:
            candidate = folder / f"{stem}{suffix}"
            if _is_model_file(candidate) and (folder / f"{stem}{PARAMS_SUFFIX}").is_file():
                found.append(candidate)
                break  # .json shadows .pdmodel of the same stem
    return found


def resolve_paddle_model(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The (program file, parameters file) of the Paddle inference model named by ``path``.

    ``path`` may be the model folder, the path prefix (``dir/inference``), the ``.json`` / ``.pdmodel``
    program file or the ``.pdiparams`` file. Raises :class:`ModelError` naming what is missing.

    Example:
        >>> resolve_paddle_model("/models/det/inference")  # doctest: +SKIP
        (PosixPath('/models/det/inference.json'), PosixPath('/models/det/inference.pdiparams'))
    """
    path = Path(path).expanduser()
    if path.is_dir():
        candidates = _candidates_in_folder(path)
        if not candidates:
            present = sorted(p.name for p in path.iterdir())[:20]
            raise ModelError(
                f"{path} holds no Paddle inference model: no <name>.json (PIR) or <name>.pdmodel with a "
                f"matching <name>.pdiparams (found: {', '.join(present) or 'nothing'})",
                hint="export one with paddle.jit.save(layer, 'dir/inference', input_spec=[...]), or pass the "
                "model's path prefix",
            )
        stems = {c.stem for c in candidates}
        if len(stems) > 1 and not stems & set(_PREFERRED_STEMS):
            raise ModelError(
                f"{path} holds several Paddle models: {', '.join(sorted(stems))}",
                hint=f"pass one path prefix, e.g. {path / sorted(stems)[0]}",
            )
        model_file = candidates[0]
    elif path.suffix in MODEL_SUFFIXES and path.is_file():
        if not _is_model_file(path):
            raise ModelError(
                f'{path} is not a Paddle program (a .json model must be a PIR program: it lacks "magic":"pir")',
                hint="pass the inference model saved by paddle.jit.save / paddle.static.save_inference_model",
            )
        model_file = path
    else:
        prefix = path.with_suffix("") if path.suffix == PARAMS_SUFFIX else path
        model_file = next(
            (Path(f"{prefix}{suffix}") for suffix in MODEL_SUFFIXES if _is_model_file(Path(f"{prefix}{suffix}"))),
            Path(),
        )
        if model_file == Path():
            raise ModelError(
                f"no Paddle model at {path}: neither {prefix}.json (PIR) nor {prefix}.pdmodel exists",
                hint="pass the model folder, the path prefix (dir/inference) or the .json/.pdmodel file",
            )
    params_file = model_file.with_suffix(PARAMS_SUFFIX)
    if not params_file.is_file():
        raise ModelError(
            f"Paddle model {model_file} has no parameters file {params_file.name} next to it",
            hint="copy the .pdiparams saved with the model into the same folder (same name, .pdiparams suffix)",
        )
    return model_file, params_file


def is_paddle_model(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a Paddle inference model (see :func:`resolve_paddle_model`); never raises.

    Example:
        >>> is_paddle_model("model.onnx")
        False
    """
    try:
        resolve_paddle_model(path)
    except (ModelError, OSError):
        return False
    return True


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where converted models are cached: ``cache_dir``, else ``$GRAPHBISECT_CACHE/paddle2onnx``, else
    ``~/.cache/graphbisect/paddle2onnx``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("GRAPHBISECT_CACHE")
    if env:
        return Path(env).expanduser() / "paddle2onnx"
    return Path.home() / ".cache" / "graphbisect" / "paddle2onnx"


def _paddle2onnx_version() -> str:
    if importlib.util.find_spec("paddle2onnx") is None:
        raise ModelError(
            f"converting a Paddle model needs paddle2onnx, which is not installed in {sys.executable}",
            hint="pip install 'graphbisect[paddle]' (paddlepaddle + paddle2onnx), or convert the model "
            "yourself (paddle2onnx --model_dir ...) and pass the .onnx file",
        )
    try:
        return importlib.metadata.version("paddle2onnx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _content_key(model_file: Path, params_file: Path, opset: int, converter_version: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"graphbisect-paddle2onnx-v1\0opset={opset}\0paddle2onnx={converter_version}\0".encode())
    for path in (model_file, params_file):
        digest.update(f"{path.suffix}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _converter_message(log: str) -> str:
    """The converter's own words about the failure: its [ERROR] lines, else the log's last lines."""
    lines = [_TIMESTAMP.sub("", _ANSI.sub("", line)).rstrip() for line in log.splitlines()]
    lines = [line for line in lines if line.strip()]
    errors = [line for line in lines if "[ERROR]" in line or "Error" in line or "error:" in line]
    chosen = errors[-5:] if errors else lines[-5:]
    return "\n    ".join(chosen) if chosen else "(it printed nothing)"


def convert_paddle_model(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    opset: int | None = None,
) -> tuple[Path, Path]:
    """Convert a Paddle inference model to ONNX with paddle2onnx; return (cached ONNX path, program file).

    The second element is the Paddle program file (``.json`` or ``.pdmodel``): what the ``paddle``
    backend runs. A cache hit (same model and params bytes, opset and paddle2onnx version) returns at once
    without importing Paddle. Failures raise :class:`ModelError` quoting the converter and pointing at the
    full log kept in the cache folder.

    Example:
        >>> onnx_path, program = convert_paddle_model("models/det")  # doctest: +SKIP
        >>> onnx_path.parent.name, program.name  # doctest: +SKIP
        ('paddle2onnx', 'inference.json')
    """
    model_file, params_file = resolve_paddle_model(path)
    opset = DEFAULT_OPSET if opset is None else int(opset)
    converter_version = _paddle2onnx_version()
    key = _content_key(model_file, params_file, opset, converter_version)
    root = cache_root(cache_dir)
    onnx_path = root / f"{key}.onnx"
    if onnx_path.is_file():
        logger.debug("paddle2onnx cache hit for %s: %s", model_file, onnx_path)
        return onnx_path, model_file

    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(
            f"cannot create the paddle2onnx cache folder {root}: {exc}",
            hint="set $GRAPHBISECT_CACHE to a writable folder",
        ) from exc
    logger.info("converting %s with paddle2onnx %s (opset %d)", model_file, converter_version, opset)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".onnx.tmp", dir=root)
    os.close(fd)
    tmp_path = Path(tmp_name)
    log_path = root / f"{key}.log"
    started = time.monotonic()
    try:
        _convert_to(tmp_path, model_file, params_file, opset, converter_version, log_path=log_path)
        os.replace(tmp_path, onnx_path)
        meta = {
            "source": str(model_file),
            "params": str(params_file),
            "opset": opset,
            "paddle2onnx": converter_version,
            "seconds": round(time.monotonic() - started, 3),
        }
        (root / f"{key}.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        log_path.unlink(missing_ok=True)
    finally:
        tmp_path.unlink(missing_ok=True)
    logger.info("converted %s in %.1f s -> %s", model_file, time.monotonic() - started, onnx_path)
    return onnx_path, model_file


def _convert_to(tmp_path: Path, model_file: Path, params_file: Path, opset: int, converter_version: str, *,
                log_path: Path) -> None:
    """Run paddle2onnx in a child interpreter, writing ``tmp_path``; a failure writes its log to ``log_path``
    and raises :class:`ModelError` quoting it."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CONVERT_SCRIPT, str(model_file), str(params_file), str(tmp_path), str(opset)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=CONVERT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ModelError(
            f"paddle2onnx {converter_version} did not finish converting {model_file} within "
            f"{CONVERT_TIMEOUT_S:.0f} s",
            hint="convert it yourself (paddle2onnx --model_dir ... --save_file model.onnx) and pass the .onnx file",
        ) from exc
    log = proc.stdout.decode("utf-8", errors="replace")
    converted = proc.returncode == 0 and tmp_path.is_file() and tmp_path.stat().st_size > 0
    if not converted:
        log_path.write_text(log, encoding="utf-8")
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        raise ModelError(
            f"paddle2onnx {converter_version} could not convert {model_file} ({how}):\n    "
            f"{_converter_message(log)}",
            hint=f"full converter log: {log_path}. An unsupported operator needs a newer paddle2onnx "
            "or a higher opset (--opset); otherwise convert the model yourself and pass the .onnx file",
        )


@dataclass(frozen=True)
class PaddleOp:
    """One computing op of a PIR program, with the ONNX tensor names paddle2onnx gave its outputs."""

    index: int  # position in the program (parameters and feeds included)
    op: str  # op name without its dialect: "conv2d", "batch_norm_", "matmul"
    inputs: tuple[int, ...]  # value ids read
    outputs: tuple[int, ...]  # value ids written
    onnx_names: tuple[str | None, ...]  # per output: the converted model's tensor, None when it has none
    shapes: tuple[tuple[int, ...] | None, ...]  # per output, -1 for dynamic dims
    weights: frozenset[int] = frozenset()  # the inputs that are parameters (weights), not activations


def program_ops(program_file: str | os.PathLike[str], onnx_tensors: Collection[str]) -> list[PaddleOp] | None:
    """The computing ops of a PIR program (``.json``) and the ONNX tensors paddle2onnx made of their outputs.

    paddle2onnx names the tensor of output ``i`` of the ``k``-th op called ``op`` in program order
    ``p2o.pd_op.<op>.<k>.<i>``, and a fetched value by its fetch name (``fetch_name_0``); a name the
    converted model does not have (the converter folded or renamed it) maps to None. Legacy ``.pdmodel``
    programs return None: they are protobuf, and paddle2onnx renames them through a PIR translation.

    Example:
        >>> program_ops("model/inference.pdmodel", set()) is None
        True
    """
    path = Path(program_file)
    if path.suffix != ".json":
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    raw = data["program"]["regions"][0]["blocks"][0]["ops"]
    fetched: dict[int, str] = {}
    for op in raw:
        if op.get("#", "").endswith(".fetch"):
            name = _attr(op, "name")
            if isinstance(name, str) and op.get("I"):
                fetched[int(op["I"][0]["%"])] = name
    params = {int(op["O"]["%"]) for op in raw
              if op.get("#") == "p" and isinstance(op.get("O"), dict) and "%" in op["O"]}
    counters: dict[str, int] = {}
    ops: list[PaddleOp] = []
    for index, op in enumerate(raw):
        kind = str(op.get("#", ""))
        dialect, _, name = kind.partition(".")
        if kind == "p" or not name or dialect == "0" or name in ("data", "fetch"):
            continue
        k = counters.get(name, 0)
        counters[name] = k + 1
        outs = op.get("O") or []
        outs = outs if isinstance(outs, list) else [outs]
        ids = tuple(int(o.get("%", -1)) if isinstance(o, dict) else -1 for o in outs)
        names: list[str | None] = []
        for i, vid in enumerate(ids):
            guess = f"p2o.pd_op.{name}.{k}.{i}"
            names.append(fetched.get(vid) if vid in fetched and fetched[vid] in onnx_tensors
                         else guess if guess in onnx_tensors else None)
        ins = tuple(int(i["%"]) for i in op.get("I", []) if isinstance(i, dict) and "%" in i)
        ops.append(PaddleOp(index, name, ins, ids, tuple(names), tuple(_shape(o) for o in outs),
                            frozenset(i for i in ins if i in params)))
    return ops


def _attr(op: dict[str, Any], key: str) -> object:
    for entry in op.get("A", []):
        if isinstance(entry, dict) and entry.get("N") == key:
            return entry.get("AT", {}).get("D")
    return None


def _shape(out: object) -> tuple[int, ...] | None:
    try:
        dims = out["TT"]["D"][1]  # type: ignore[index]
        return tuple(int(d) for d in dims)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
