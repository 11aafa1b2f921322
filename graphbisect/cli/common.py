"""Arguments and helpers shared by the subcommands that load a model and run two backends."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.compare import Tolerance
from graphbisect.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from graphbisect.model import Model


__all__ = ["add_model_arguments", "load_feeds", "load_model_arg", "tolerance_from_args"]


def add_model_arguments(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    parser.add_argument("model", nargs="?" if optional else None,
                        help="ONNX file, or Paddle inference model (folder or path prefix)")
    parser.add_argument("--example", action="store_true",
                        help="use the bundled example model (a real ONNX Runtime bug) and its inputs")
    parser.add_argument("--oracle", default=DEFAULT_ORACLE, metavar="SPEC",
                        help=f"backend trusted to be right (default {DEFAULT_ORACLE}); see `graphbisect backends`")
    parser.add_argument("--target", default=DEFAULT_TARGET, metavar="SPEC",
                        help=f"backend under test (default {DEFAULT_TARGET})")
    parser.add_argument("--inputs", type=Path, metavar="FILE",
                        help="model inputs: .npz, .npy (single input), TensorProto .pb (file or folder), or "
                        "Polygraphy JSON; default: seeded random inputs")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                        help="shape for an input with dynamic dims, e.g. --shape images:1x3x224x224 (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    parser.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    parser.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")
    parser.add_argument("--min-cosine", type=float, default=None,
                        help="also fail a tensor whose cosine similarity is below this")
    parser.add_argument("--tol", action="append", default=[], metavar="NAME:ATOL[:RTOL]",
                        help="per-output tolerance override (repeatable)")


def _parse_tol(item: str, default_rtol: float) -> tuple[str, tuple[float, float]]:
    """``NAME:ATOL[:RTOL]``; names may contain ':' (TensorFlow-style ``x:0``), so numbers are taken from the right."""
    for count in (2, 1):
        parts = item.rsplit(":", count)
        if len(parts) == count + 1 and parts[0]:
            try:
                numbers = [float(p) for p in parts[1:]]
            except ValueError:
                continue
            return parts[0], (numbers[0], numbers[1] if count == 2 else default_rtol)
    raise InputError(f"--tol {item!r} is not NAME:ATOL[:RTOL]", hint="e.g. --tol logits:1e-2:1e-3")


def tolerance_from_args(args: argparse.Namespace) -> Tolerance:
    per_output = dict(_parse_tol(item, args.rtol) for item in args.tol)
    return Tolerance(atol=args.atol, rtol=args.rtol, min_cosine=args.min_cosine, per_output=per_output)


def load_model_arg(args: argparse.Namespace) -> Model:
    from graphbisect.model import load_model

    if args.example:
        from graphbisect.examples.bundled import example_inputs_path, example_model_path

        args.inputs = args.inputs or example_inputs_path()
        return load_model(example_model_path())
    if args.model is None:
        raise InputError("no model given", hint="pass a model file, or --example for the bundled example")
    return load_model(Path(args.model))


def load_feeds(args: argparse.Namespace, model: Model) -> dict[str, np.ndarray]:
    from graphbisect.data import load_inputs, parse_shapes, random_inputs

    shapes = parse_shapes(args.shape)
    if args.inputs is not None:
        return load_inputs(args.inputs, model)
    return random_inputs(model, shapes=shapes, seed=args.seed)
