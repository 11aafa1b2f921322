"""`graphbisect compare` over ONNX's own node tests: how many pass, and why the others do not.

The ``onnx`` wheel ships ``onnx/backend/test/data/node``: ~1,300 one-node models, each with inputs and
expected outputs as ``.pb`` files (``test_data_set_0``). This benchmark runs, for every model, what a user
would run::

    graphbisect compare MODEL --inputs MODEL_DIR/test_data_set_0 --oracle reference

(target ``onnxruntime`` at its defaults) through the library, with one pair of backend workers for all
models, and counts the outcome classes of :mod:`graphbisect.oracle.outcome` (``pass``, ``divergence``,
``random-op``, ``target-unsupported``, ...). A graphbisect error that is not an outcome (the model or the
inputs are refused, with a message) is counted by its error class; a Python traceback is counted as
``TRACEBACK`` and printed: there must be none.

Run: ``python benchmarks/node_corpus_bench.py [--quick] [--match REGEX] [--layerwise] [--list CLASS]
[--json PATH]`` (``--quick``: every 20th model).
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _common import add_size_args, describe_machine, print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphbisect.backends import BackendProcess, BackendSpec  # noqa: E402
from graphbisect.compare import compare_outputs  # noqa: E402
from graphbisect.data import load_inputs  # noqa: E402
from graphbisect.data.protos import parse_value  # noqa: E402
from graphbisect.errors import GraphBisectError  # noqa: E402
from graphbisect.model import Model, load_model  # noqa: E402
from graphbisect.oracle.outcome import OutcomeClass  # noqa: E402
from graphbisect.storage.values import as_elem_type  # noqa: E402
from graphbisect.workflows.compare import CompareResult, OracleFailed, compare_models  # noqa: E402

CORPUS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def corpus(match: str | None = None, every: int = 1) -> list[Path]:
    """The node-test folders (those with a model and a ``test_data_set_0``), sorted, optionally filtered."""
    folders = sorted(p for p in CORPUS.iterdir() if (p / "model.onnx").is_file() and (p / "test_data_set_0").is_dir())
    if match:
        folders = [p for p in folders if re.search(match, p.name)]
    return folders[::every]


def run_one(folder: Path, workers: tuple[BackendProcess, BackendProcess], *, layerwise: bool) -> tuple[str, str]:
    """(outcome class, detail) of ``compare`` on one node test."""
    try:
        model = load_model(folder / "model.onnx")
        inputs = load_inputs(folder / "test_data_set_0", model)
        with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
            result = compare_models(model, oracle=workers[0].spec, target=workers[1].spec, inputs=inputs,
                                    workdir=Path(tmp), layerwise=layerwise, workers=workers)
        cls, detail = result.outcome.cls.value, result.outcome.detail
        if result.outcome.cls is OutcomeClass.DIVERGENCE and result.comparison is not None:
            cls += f" ({_who_is_wrong(folder, model, result)})"
        return cls, detail
    except OracleFailed as exc:
        return exc.outcome.cls.value, exc.outcome.detail
    except GraphBisectError as exc:
        return f"error: {type(exc).__name__}", exc.message.splitlines()[0]
    except Exception:
        return "TRACEBACK", traceback.format_exc()


def _who_is_wrong(folder: Path, model: Model, result: CompareResult) -> str:
    """Which side of a divergence disagrees with the node test's own expected outputs (``output_N.pb``)."""
    types = {info.name: info.type for info in model.proto.graph.output}
    expected = {}
    for index, name in enumerate(model.output_names):
        file = folder / "test_data_set_0" / f"output_{index}.pb"
        if file.is_file():
            value = parse_value(file.read_bytes(), types.get(name))[1]
            declared = types[name].tensor_type.elem_type if name in types and types[name].HasField("tensor_type") else 0
            # the node tests store bfloat16 outputs as UINT16 tensors: read them as the declared type
            expected[name] = as_elem_type(value, declared) if declared and isinstance(value, np.ndarray) else value
    if len(expected) != len(model.output_names):
        return "no expected outputs"
    oracle_ok = compare_outputs(expected, result.oracle_run.outputs).passed
    target_ok = compare_outputs(expected, result.target_run.outputs).passed
    return {(True, False): "target differs from the spec", (False, True): "oracle differs from the spec",
            (True, True): "both match the spec", (False, False): "both differ from the spec"}[(oracle_ok, target_ok)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_size_args(parser)
    parser.add_argument("--match", help="only node tests whose name matches this regular expression")
    parser.add_argument("--layerwise", action="store_true", help="also run the layerwise probes (4 runs, not 2)")
    parser.add_argument("--list", nargs="*", metavar="CLASS",
                        help="print the models of these classes (default: every class but pass)")
    parser.add_argument("--target", default="onnxruntime", help="target spec (default onnxruntime)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    folders = corpus(args.match, every=20 if args.quick else 1)
    print(describe_machine())
    print(f"onnx {onnx.__version__}: {len(folders)} node tests from {CORPUS}\n")
    counts: collections.Counter[str] = collections.Counter()
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="corpus-workers-") as tmp, \
            BackendProcess(BackendSpec.parse("reference"), workdir=Path(tmp) / "oracle") as oracle, \
            BackendProcess(BackendSpec.parse(args.target), workdir=Path(tmp) / "target") as target:
        for index, folder in enumerate(folders, 1):
            cls, detail = run_one(folder, (oracle, target), layerwise=args.layerwise)
            counts[cls] += 1
            rows.append({"model": folder.name, "class": cls, "detail": detail})
            if cls == "TRACEBACK":
                print(f"TRACEBACK in {folder.name}:\n{detail}", file=sys.stderr)
            if index % 100 == 0:
                print(f"... {index}/{len(folders)} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    seconds = time.monotonic() - started
    print_table("outcomes", ["outcome class", "models"],
                [[cls, n] for cls, n in counts.most_common()] + [["total", len(rows)]])
    print(f"\n{seconds:.0f} s in all, {seconds / max(len(rows), 1):.2f} s per model")
    listed = args.list if args.list is not None else [cls for cls, _ in counts.most_common() if cls != "pass"]
    for wanted in listed:
        chosen = [row for row in rows if row["class"] == wanted]
        if chosen:
            print(f"\n{wanted} ({len(chosen)}):")
            for row in chosen:
                print(f"  {row['model']}: {row['detail'].splitlines()[0][:160] if row['detail'] else ''}")
    if args.json:
        write_json(args.json, {"onnx": onnx.__version__, "counts": dict(counts), "seconds": seconds, "models": rows})
    return 1 if counts["TRACEBACK"] else 0


if __name__ == "__main__":
    os.environ.setdefault("GRAPHBISECT_LOG", "error")
    sys.exit(main())
