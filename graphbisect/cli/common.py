"""Arguments and helpers shared by the subcommands that load a model and run two backends."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphbisect.backends.registry import BACKEND_SPEC, DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.compare import Tolerance
from graphbisect.compare.metrics import check_tolerance_value
from graphbisect.errors import InputError
from graphbisect.executors.base import EXECUTOR
from graphbisect.settings import options
from graphbisect.settings.options import Allowed

if TYPE_CHECKING:
    import numpy as np

    from graphbisect.data import ChosenDim
    from graphbisect.model import Model


__all__ = [
    "add_model_arguments",
    "backend_spec",
    "chosen_for",
    "cosine",
    "count",
    "executor",
    "exit_code",
    "load_feeds",
    "load_model_arg",
    "not_a_regular_file",
    "output_file",
    "output_path",
    "refuse_inside",
    "refuse_same",
    "regex",
    "seconds",
    "seed",
    "tolerance",
    "tolerance_from_args",
    "tolerance_override",
]


# --- argument types: every value is checked when the command line is parsed, with a hint ----------------
# argparse turns an ArgumentTypeError into "graphbisect CMD: error: argument --atol: MESSAGE" and exit 2.


def _finite(text: str, what: str, example: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what}; e.g. {example})") from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number ({what}; e.g. {example})")
    return value


def tolerance(text: str) -> float:
    """An atol/rtol: a finite number >= 0 (NaN or inf would make every comparison pass)."""
    value = _finite(text, "a tolerance is a finite number >= 0", "1e-4")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative (a tolerance is a finite number >= 0; e.g. 1e-4)")
    return value


def cosine(text: str) -> float:
    """A cosine similarity threshold in [-1, 1]."""
    value = _finite(text, "a cosine similarity is between -1 and 1", "0.999")
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not between -1 and 1 (a cosine similarity; e.g. 0.999)")
    return value


def _argument(allowed: Allowed, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type: ``convert`` the text, then check it against ``allowed``, the range the options
    objects themselves declare (``graphbisect/settings/options.py``), so the CLI and the Python API agree."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed.describe} (e.g. {allowed.example})") from exc
        found = allowed.reason(value)
        if found is not None:
            why, cause = found
            hint = cause.hint if cause is not None and cause.hint else f"e.g. {allowed.example}"
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {why} ({hint})") from cause
        return value

    parse.__name__ = allowed.describe  # argparse's "invalid <name> value" if convert raises something else
    return parse


#: A duration: a finite number of seconds > 0.
seconds = _argument(options.seconds(), float)
#: A Python regular expression that compiles.
regex = _argument(options.pattern, str)
#: A seed of random inputs (>= 0).
seed = _argument(options.SEED, int)
#: A failing exit status (1 to 255).
exit_code = _argument(options.EXIT_CODE, int)
#: An executor spec: local, ray or ray:ADDRESS.
executor = _argument(EXECUTOR, str)
#: A backend spec whose name and option keys are known (availability is checked when it runs).
backend_spec = _argument(BACKEND_SPEC, str)


def count(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum`` (e.g. ``-j`` needs 1 worker at least)."""
    return _argument(options.whole(minimum), int)


def tolerance_override(text: str) -> str:
    """``NAME:ATOL[:RTOL]`` with valid numbers (the name is checked against the model once it is loaded)."""
    try:
        _parse_tol(text, 0.0)
    except InputError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} ({exc.hint})") from exc
    return text


def output_path(text: str) -> Path:
    """A file or folder graphbisect will write: its folder must exist or be creatable, and be writable.

    Checked by creating (and removing) a probe file in the nearest existing folder, because permission
    bits do not tell: root may write anywhere except pseudo file systems such as /proc.
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {ancestor} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".graphbisect-probe-", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {ancestor} is not writable "
                                          f"({exc.strerror or exc}); choose a writable place") from exc
    return path


def output_file(text: str) -> Path:
    """A file graphbisect will write (``--json``, ``--html``, ``--csv``): as :func:`output_path`, and if it
    exists, a regular file. graphbisect writes a new file and renames it over the old one, so a device
    (``/dev/null``, ``/dev/full``), a named pipe or a symbolic link there would be *replaced* by a regular
    file (issue 24: as root, ``--json /dev/null`` broke the machine); a folder is no file to write.
    """
    path = output_path(text)
    problem = not_a_regular_file(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {problem}")
    return path


def not_a_regular_file(path: Path) -> str | None:
    """Why graphbisect must not replace ``path`` with the file it writes (None: missing, or a regular file).

    Example:
        >>> not_a_regular_file(Path("/dev/null"))
        'it is a character device: graphbisect replaces the file it writes, so name a new or regular file'
    """
    from graphbisect.storage.atomic import not_regular

    return not_regular(path)


def refuse_inside(files: dict[str, Path | None], folder: Path | None, what: str) -> None:
    """Raise :class:`InputError` when one of ``files`` (option -> path) lies inside ``folder`` (``what`` says
    whose it is: a bundle, a work folder): writing it would replace a file of theirs (issue 24)."""
    if folder is None:
        return
    root = Path(os.path.realpath(folder))
    for option, path in files.items():
        if path is None:
            continue
        real = Path(os.path.realpath(path))
        if real == root or root in real.parents:
            raise InputError(f"{option} {path} is inside {what} {folder}: writing it there would replace or add "
                             "a file of theirs",
                             hint=f"write {option} outside {folder}, e.g. beside it")


def refuse_same(files: dict[str, Path | None]) -> None:
    """Raise :class:`InputError` when two output options name one file (the second would replace the first)."""
    seen: dict[str, str] = {}
    for option, path in files.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"{seen[real]} and {option} name the same file {path}: the second would replace the first",
                             hint="give each its own file")
        seen[real] = option


class PerOutputTolerance(argparse.Action):
    """``--atol out:1e-3`` as Polygraphy writes it: a bare number is the default, ``NAME:VALUE`` one output's
    (names may contain ':', the number is taken from the right). Stores the default under ``dest`` and the
    overrides under ``<dest>_per_output``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        per_output = dict(getattr(namespace, f"{self.dest}_per_output", None) or {})
        for item in values if isinstance(values, list) else [values]:
            name, sep, number = str(item).rpartition(":")
            try:
                value = tolerance(number if sep else str(item))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, f"{exc} (or NAME:VALUE for one output, e.g. out:1e-3)") from exc
            if sep and name:
                per_output[name] = value
            else:
                setattr(namespace, self.dest, value)
        setattr(namespace, f"{self.dest}_per_output", per_output)


#: What ``--example`` loads, per kind: a short description for the help.
EXAMPLES = {
    "bug": "the bundled example model (a 200-node network with a real ONNX Runtime LayerNorm bug) and its inputs",
    "precision": "the bundled precision example (a residual CNN whose block3 overflows in fp16) and its inputs",
}


def add_model_arguments(parser: argparse.ArgumentParser, *, atol: float = 1e-4, rtol: float = 1e-3,
                        example: str = "bug") -> None:
    """The model, backends, inputs and tolerance arguments; ``atol``/``rtol`` are the command's defaults
    (the help states the ones the command uses). The model is optional on the command line because
    ``--example`` replaces it; :func:`load_model_arg` asks for one of the two."""
    parser.add_argument("model", nargs="?",
                        help="ONNX file, or Paddle inference model (folder or path prefix); or --example")
    parser.add_argument("--example", action="store_const", const=example, default=None,
                        help=f"use {EXAMPLES[example]} instead of MODEL")
    parser.add_argument("--oracle", default=DEFAULT_ORACLE, metavar="SPEC", type=backend_spec,
                        help=f"backend trusted to be right (default {DEFAULT_ORACLE}); see `graphbisect backends`")
    parser.add_argument("--target", default=DEFAULT_TARGET, metavar="SPEC", type=backend_spec,
                        help=f"backend under test (default {DEFAULT_TARGET}); ONNX Runtime provider options are "
                        "<ep>.<key>=<value>, e.g. onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf32=0")
    parser.add_argument("--inputs", type=Path, metavar="FILE",
                        help="model inputs: .npz, .npy (single input), TensorProto .pb (file or folder), or "
                        "Polygraphy JSON; default: seeded random inputs")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                        help="shape for an input with dynamic dims, e.g. --shape images:1x3x224x224 (repeatable)")
    parser.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default 0)")
    parser.add_argument("--atol", action=PerOutputTolerance, default=atol, metavar="[NAME:]ATOL",
                        help=f"absolute tolerance (default {atol:g}); NAME:ATOL sets one output's, as Polygraphy "
                        "does (repeatable): --atol 1e-4 --atol logits:1e-2")
    parser.add_argument("--rtol", action=PerOutputTolerance, default=rtol, metavar="[NAME:]RTOL",
                        help=f"relative tolerance (default {rtol:g}); NAME:RTOL sets one output's (repeatable)")
    parser.add_argument("--min-cosine", type=cosine, default=None,
                        help="also fail a tensor whose cosine similarity is below this")
    parser.add_argument("--tol", action="append", type=tolerance_override, default=[], metavar="NAME:ATOL[:RTOL]",
                        help="per-output tolerance override (repeatable)")
    parser.add_argument("--int-atol", type=tolerance, default=1.0, metavar="N",
                        help="quantized tensors (of QuantizeLinear/DequantizeLinear, QLinear* ops) may be N "
                        "quantization steps (LSB) off (default 1: a tie rounded the other way); a float on a "
                        "quantization grid N steps more; other integers (indices, shapes) compare exactly; "
                        "0 = exact")


def _parse_tol(item: str, default_rtol: float) -> tuple[str, tuple[float, float]]:
    """``NAME:ATOL[:RTOL]``; names may contain ':' (TensorFlow-style ``x:0``), so numbers are taken from the right."""
    for count in (2, 1):
        parts = item.rsplit(":", count)
        if len(parts) == count + 1 and parts[0]:
            try:
                numbers = [float(p) for p in parts[1:]]
            except ValueError:
                continue
            pair = (numbers[0], numbers[1] if count == 2 else default_rtol)
            for what, value in zip(("atol", "rtol"), pair, strict=True):
                check_tolerance_value(f"--tol {item!r}: {what}", value, f"--tol {parts[0]}:1e-2:1e-3")
            return parts[0], pair
    raise InputError(f"--tol {item!r} is not NAME:ATOL[:RTOL]", hint="e.g. --tol logits:1e-2:1e-3")


def tolerance_from_args(args: argparse.Namespace) -> Tolerance:
    """The tolerance of a command line: ``--atol``/``--rtol`` (with their ``NAME:VALUE`` items) and ``--tol``."""
    atols: dict[str, float] = getattr(args, "atol_per_output", None) or {}
    rtols: dict[str, float] = getattr(args, "rtol_per_output", None) or {}
    per_output = {name: (atols.get(name, args.atol), rtols.get(name, args.rtol)) for name in {*atols, *rtols}}
    per_output.update(_parse_tol(item, args.rtol) for item in args.tol)
    return Tolerance(atol=args.atol, rtol=args.rtol, min_cosine=args.min_cosine, per_output=per_output,
                     int_atol=getattr(args, "int_atol", 1.0))


def load_model_arg(args: argparse.Namespace) -> Model:
    from graphbisect.model import load_model

    if args.example and args.model is not None:
        raise InputError(f"both a model ({args.model}) and --example given",
                         hint="drop --example to use your model, or the model to use the bundled example")
    if args.example == "precision":
        from graphbisect.examples.precision_models import cnn_inputs, residual_cnn

        args.example_inputs = None if args.inputs else cnn_inputs()
        model = load_model(residual_cnn())
    elif args.example:
        from graphbisect.examples.bundled import example_inputs_path, example_model_path

        args.inputs = args.inputs or example_inputs_path()
        model = load_model(example_model_path())
    elif args.model is None:
        raise InputError("no model given", hint="pass a model file, or --example for the bundled example")
    else:
        model = load_model(Path(args.model))
    check_tolerance_names(args, model)
    return model


def check_tolerance_names(args: argparse.Namespace, model: Model) -> None:
    """Every ``--tol NAME:...`` and ``--atol/--rtol NAME:...`` must name a tensor of the model (a typo would
    silently change nothing)."""
    named = [(f"--tol {item!r}", _parse_tol(item, 0.0)[0]) for item in getattr(args, "tol", None) or []]
    for option in ("atol", "rtol"):
        named += [(f"--{option} {name}:...", name) for name in getattr(args, f"{option}_per_output", None) or {}]
    for what, name in named:
        if not model.has_tensor(name):
            raise InputError(f"{what}: the model has no tensor {name!r}",
                             hint=f"outputs are: {', '.join(model.output_names)}")


def chosen_for(args: argparse.Namespace, model: Model) -> tuple[ChosenDim, ...]:
    """The dynamic dims graphbisect sized in :func:`load_feeds`' random inputs (none for a file, the example)."""
    from graphbisect.data import chosen_dims, parse_shapes

    if getattr(args, "example_inputs", None) is not None or args.inputs is not None:
        return ()
    return chosen_dims(model, shapes=parse_shapes(args.shape))


def load_feeds(args: argparse.Namespace, model: Model) -> dict[str, np.ndarray]:
    from graphbisect.data import load_inputs, parse_shapes, random_inputs

    shapes = parse_shapes(args.shape)
    example = getattr(args, "example_inputs", None)
    if shapes and (example is not None or args.inputs is not None):  # said, not silently dropped
        given = "the example's inputs" if example is not None else str(args.inputs)
        print(f"note: --shape is not used: {given} fix every input's shape", file=sys.stderr)
    if example is not None:
        return dict(example)
    if args.inputs is not None:
        return load_inputs(args.inputs, model)
    return random_inputs(model, shapes=shapes, seed=args.seed)
