"""Where `compare --layerwise` spends its CPU on a large model, part by part, in one process.

`compare_bench.py` measures the whole command against two plain runs; this one measures the parts the command
adds, each alone, so that a change to one part shows above the noise of a whole run (on a shared 2-core
machine a whole run moves by ±20 %). The model is `compare_bench`'s chain (``--nodes`` elementwise nodes on
a ``[1, 256]`` tensor: per node and per tensor costs are all there is). Parts, in the order a run meets them:

* ``load``: :func:`graphbisect.model.load_model` (read, normalize, index);
* ``types``: onnx shape inference on the model (:func:`~graphbisect.model.normalize.infer_types`), made once
  per run for the probe models' declarations;
* ``capture model``: the oracle's probe model, every intermediate exposed, made and saved;
* ``mapping ahead``: what mapping ONNX Runtime's optimized model needs of the model alone
  (:class:`~graphbisect.localize.optimized.OriginalGraph` and, where the checkout has them, the types each node
  computes in: :func:`~graphbisect.localize.runtime_precision.node_precisions`), made while the target builds;
* ``mapping``: :func:`~graphbisect.workflows.probe.compiled_of` of the optimized model ORT saved (after the
  part above);
* ``replay model``: the optimized model with the surviving tensors exposed, written;
* ``worker compare``: the target's worker comparing every probed tensor with the oracle's activation store
  (:func:`~graphbisect.backends.worker.compare_to_store`, bit-identical values: the chain passes);
* ``statistics sent``: its reply to JSON and back, and the statistics made again in the host;
* ``table``: :func:`~graphbisect.localize.layerwise.analyze_layers` of those statistics;
* ``ORT build ...``: ONNX Runtime's own session builds of the run, for scale: the target's plain build
  (``all``, saving its optimized model), the oracle's capture (``disable``, every tensor exposed), the replay
  (``disable``, the optimized model with its tensors exposed).

Each part is timed ``--repeats`` times by CPU time (``time.process_time``: this process, its threads
included), reporting the median and the least. Run it under ``PYTHONPATH`` on two checkouts, in turns, for a
before/after pair.

    python benchmarks/compare_parts_bench.py [--nodes 5000] [--repeats 9] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, print_table, write_json
from compare_bench import chain_model

from graphbisect.backends.worker import compare_to_store, write_outputs
from graphbisect.data.store import ActivationStore
from graphbisect.localize.layerwise import analyze_layers
from graphbisect.localize.optimized import OriginalGraph
from graphbisect.model import load_model
from graphbisect.model.io import save_proto
from graphbisect.model.normalize import infer_types
from graphbisect.workflows.probe import compiled_of, mapping_ahead, replay_model

metrics = importlib.import_module("graphbisect.compare.metrics")  # graphbisect.compare is also a function


def _session(path: Path, level: ort.GraphOptimizationLevel, saved: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if saved is not None:
        options.optimized_model_filepath = str(saved)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def parts(folder: Path, nodes: int) -> dict[str, Callable[[], object]]:
    """The parts to time, on the chain of ``nodes`` nodes written into ``folder`` with what they read (the
    model, the oracle's capture as an activation store, the optimized model ONNX Runtime saved: kept there and
    read again by a later run with the same ``folder``)."""
    path, capture, saved = folder / "model.onnx", folder / "capture.onnx", folder / "optimized.onnx"
    store_dir, replay = folder / "activations", folder / "replay.onnx"
    if not (store_dir / "manifest.json").is_file():
        proto, feeds = chain_model(nodes)
        onnx.save(proto, path)
        made = load_model(path)
        save_proto(made.with_outputs([n for n in made.intermediate_names() if n not in set(made.output_names)]),
                   capture)
        _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, saved)
        session = _session(capture, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        names = [value.name for value in session.get_outputs()]
        write_outputs(dict(zip(names, session.run(names, feeds), strict=True)), names, store_dir)
    model = load_model(path)
    intermediates = [n for n in model.intermediate_names() if n not in set(model.output_names)]
    store = ActivationStore.open(store_dir)
    values = {name: np.array(store.get(name)) for name in intermediates}  # what the target's replay returns
    tol = metrics.Tolerance()
    mapping_ahead(model)
    info = {"optimized_model": str(saved)}
    compiled = compiled_of(model, info)
    replay_model(saved, model, intermediates, replay)
    reply = compare_to_store(values, intermediates, store_dir, tol.to_json())
    measured = dict(zip(intermediates, metrics.stats_from_columns(reply["columns"]), strict=True))
    constants = {t.name: t for t in model.proto.graph.initializer}
    return {
        "load": lambda: load_model(path),
        "types": lambda: infer_types(model.proto),
        "capture model": lambda: save_proto(model.with_outputs(intermediates), folder / "capture2.onnx"),
        "mapping ahead": lambda: _ahead(model, constants),
        "mapping": lambda: compiled_of(model, info),
        "replay model": lambda: replay_model(saved, model, intermediates, folder / "replay2.onnx"),
        "worker compare": lambda: compare_to_store(values, intermediates, store_dir, tol.to_json()),
        "statistics sent": lambda: metrics.stats_from_columns(json.loads(json.dumps(reply))["columns"]),
        "table": lambda: analyze_layers(model.nodes, store, None, tol, compiled=compiled, measured=measured,
                                        outputs=model.output_names),
        "ORT build: target, all + save": lambda: _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                                          folder / "optimized2.onnx"),
        "ORT build: oracle capture": lambda: _session(capture, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        "ORT build: replay": lambda: _session(replay, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    }


def _ahead(model: Any, constants: dict[str, onnx.TensorProto]) -> object:
    """What :func:`mapping_ahead` makes, made again (it keeps what it made per model)."""
    made = OriginalGraph(model.nodes, constants)
    precisions = getattr(importlib.import_module("graphbisect.localize.runtime_precision"), "node_precisions", None)
    if precisions is None:  # a checkout from before node precisions were made ahead
        return made
    from graphbisect.localize.layerwise import constant_tensors
    from graphbisect.workflows.probe import element_types

    return made, precisions(model.nodes, element_types(model), constant_tensors(model.nodes, model.initializer_names))


def timed(job: Callable[[], object], repeats: int) -> list[float]:
    """CPU seconds of ``repeats`` calls of ``job``, one each."""
    spent = []
    for _ in range(repeats):
        started = time.process_time()
        job()
        spent.append(time.process_time() - started)
    return spent


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="nodes of the chain (default 5000)")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per part (default 9; 0: only the "
                        "set-up, for an instruction count's difference, below)")
    parser.add_argument("--only", nargs="+", metavar="PART", help="time only these parts (their names as printed)")
    parser.add_argument("--data", type=Path, help="keep the model, the store and the optimized model in this "
                        "folder and read them from it when there (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="graphbisect-parts-") as tmp:
        folder = args.data or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        jobs = parts(folder, args.nodes)
        unknown = sorted(set(args.only or ()) - set(jobs))
        if unknown:
            raise SystemExit(f"no part named {unknown[0]!r}; the parts: {', '.join(jobs)}")
        results: dict[str, Any] = {name: timed(job, args.repeats) for name, job in jobs.items()
                                   if args.only is None or name in args.only}
    if not args.repeats:
        return 0
    rows = [[name, f"{statistics.median(spent) * 1000:.1f}", f"{min(spent) * 1000:.1f}"]
            for name, spent in results.items()]
    ours = sum(statistics.median(spent) for name, spent in results.items() if not name.startswith("ORT"))
    rows.append(["graphbisect's parts, in all", f"{ours * 1000:.1f}", ""])
    print_table(f"compare --layerwise on a chain of {args.nodes} nodes: CPU ms per part ({args.repeats} calls each)",
                ["part", "median", "least"], rows, notes=describe_machine().split("\n"))
    write_json(args.json, {"nodes": args.nodes, "repeats": args.repeats, "cpu_seconds": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
