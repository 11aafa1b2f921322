"""Scale-out figures for `graphbisect triage`: model and candidate throughput, and large-model overhead.

1. **triage throughput**: a folder of failing host networks (LayerNorm keepdims=0 bugs at several
   positions/seeds, FuseReluClip crashes) triaged with the local executor and 1, 2 and N worker processes:
   models per hour and distinct bugs found (must not change with the workers);
2. **candidate throughput**: one reduction with 1, 2 and N target workers (``ReduceOptions.jobs``): target
   runs per second, with the same result (final nodes) for every N;
3. **large models**: a host network of ``--large-nodes`` nodes (default 50,000): compare (plain + layerwise)
   and a reduction capped at ``--large-budget`` candidate runs, with wall time, seconds per candidate and the
   peak resident memory of the whole process tree; and a model whose external weights exceed 2 GB
   (``--weights-gb``; a Gather from a huge embedding table into a float64 ReLU→Clip island that ORT's
   FuseReluClip crashes on): load, compare, reduce, per-candidate seconds and peak memory.

Run: ``python benchmarks/triage_bench.py [--quick | --full] [--json PATH]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MemorySampler, add_size_args, describe_machine, mib, print_table, write_json

from graphbisect.examples import host_network
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from graphbisect.workflows.reduce import ReduceOptions, reduce_model
from graphbisect.workflows.triage import triage

BUGS = [("layernorm_keepdims0", "main"), ("layernorm_keepdims0", "branch"), ("relu_clip_f64", "main"),
        ("layernorm_keepdims0", "masked"), ("relu_clip_f64", "branch")]


def _workers() -> list[int]:
    return sorted({1, 2, os.cpu_count() or 1})


def make_folder(folder: Path, count: int, nodes: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        bug, position = BUGS[i % len(BUGS)]
        host = host_network(nodes + 10 * i, bug=bug, position=position, seed=i)
        onnx.save(host.model, str(folder / f"m{i:03d}_{bug}_{position}.onnx"))
        np.savez(folder / f"m{i:03d}_{bug}_{position}.npz", **host.inputs)
    return folder


def bench_triage(tmp: Path, count: int, nodes: int) -> list[dict[str, Any]]:
    folder = make_folder(tmp / "triage-in", count, nodes)
    rows = []
    for workers in _workers():
        out = tmp / f"triage-out-{workers}"
        started = time.monotonic()
        result = triage(folder, out, executor="local", jobs=workers)
        seconds = time.monotonic() - started
        rows.append({"workers": workers, "models": count, "seconds": round(seconds, 2),
                     "models_per_hour": round(count / seconds * 3600), "distinct_bugs": len(result.bugs),
                     "keys": [b.key for b in result.bugs]})
        shutil.rmtree(out, ignore_errors=True)
    return rows


def bench_candidates(tmp: Path, nodes: int) -> list[dict[str, Any]]:
    host = host_network(nodes, bug="layernorm_keepdims0", position="main")
    model = load_model(host.model)
    rows = []
    for workers in _workers():
        started = time.monotonic()
        result = reduce_model(model, tmp / f"cand-{workers}", inputs=host.inputs,
                              options=ReduceOptions(jobs=workers, layerwise=False))
        seconds = time.monotonic() - started
        runs = result.invocations["target"]
        rows.append({"workers": workers, "nodes": nodes, "target_runs": runs, "seconds": round(seconds, 2),
                     "runs_per_s": round(runs / seconds, 2), "final_nodes": result.final_nodes})
    return rows


def _measured(fn: Any) -> tuple[Any, float, float]:
    with MemorySampler(0.05) as mem:
        started = time.monotonic()
        value = fn()
    return value, time.monotonic() - started, mib(mem.peak_bytes)


def bench_large_host(tmp: Path, nodes: int, budget: int) -> dict[str, Any]:
    host, build_s, _ = _measured(lambda: host_network(nodes, bug="layernorm_keepdims0", position="main"))
    model, load_s, _ = _measured(lambda: load_model(host.model))
    compared, compare_s, compare_mib = _measured(lambda: compare_models(model, inputs=host.inputs,
                                                                        workdir=tmp / "large-compare"))
    shutil.rmtree(tmp / "large-compare", ignore_errors=True)
    options = ReduceOptions(max_invocations=budget, layerwise=False, keep_work=True)
    result, reduce_s, reduce_mib = _measured(lambda: reduce_model(model, tmp / "large-reduce", inputs=host.inputs,
                                                                  options=options))
    store = tmp / "large-reduce.work" / "activations"
    store_mib = mib(sum(p.stat().st_size for p in store.glob("*.npy"))) if store.exists() else 0.0
    return {"nodes": nodes, "build_s": round(build_s, 1), "load_s": round(load_s, 1),
            "compare_s": round(compare_s, 1), "compare_verdict": "pass" if compared.passed else "fail",
            "compare_peak_mib": round(compare_mib), "reduce_s": round(reduce_s, 1),
            "reduce_target_runs": result.invocations["target"], "final_nodes": result.final_nodes,
            "s_per_target_run": round(reduce_s / max(1, result.invocations["target"]), 2),
            "reduce_peak_mib": round(reduce_mib), "activation_store_mib": round(store_mib, 1)}


def huge_weights_model(folder: Path, gigabytes: float) -> tuple[Path, dict[str, np.ndarray]]:
    """Gather from a ``gigabytes`` float32 table → Cast(double) → ReLU → Clip(0, 6): FuseReluClip crashes ORT."""
    width = 1024
    rows = int(gigabytes * 2**30 / (4 * width))
    # Written straight to the external-data file: a ModelProto holding > 2 GB cannot even be serialized.
    table = np.memmap(folder / "huge.data", mode="w+", dtype=np.float32, shape=(rows, width))
    for start in range(0, rows, 65536):
        table[start:start + 65536] = np.float32(start % 7 - 3)
    table.flush()
    del table
    init = onnx.TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, width],
                            data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "huge.data"), ("offset", "0"), ("length", str(rows * width * 4))):
        init.external_data.add(key=key, value=value)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["g"], name="gather"),
             helper.make_node("Cast", ["g"], ["g64"], to=TensorProto.DOUBLE, name="cast"),
             helper.make_node("Relu", ["g64"], ["r"], name="relu"),
             helper.make_node("Clip", ["r", "lo", "hi"], ["y"], name="clip")]
    graph = helper.make_graph(nodes, "huge", [helper.make_tensor_value_info("idx", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4, width])],
                              [init, numpy_helper.from_array(np.array(0.0), "lo"),
                               numpy_helper.from_array(np.array(6.0), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "huge.onnx"
    onnx.save(model, str(path))
    return path, {"idx": np.array([0, 1, rows // 2, rows - 1], dtype=np.int64)}


def bench_huge_weights(tmp: Path, gigabytes: float) -> dict[str, Any]:
    folder = tmp / "huge"
    folder.mkdir()
    (path, feeds), make_s, _ = _measured(lambda: huge_weights_model(folder, gigabytes))
    model, load_s, load_mib = _measured(lambda: load_model(path))
    _, compare_s, compare_mib = _measured(lambda: compare_models(model, inputs=feeds, workdir=tmp / "huge-compare"))
    shutil.rmtree(tmp / "huge-compare", ignore_errors=True)
    result, reduce_s, reduce_mib = _measured(lambda: reduce_model(model, tmp / "huge-bundle", inputs=feeds))
    return {"weights_gb": round((folder / "huge.data").stat().st_size / 2**30, 2), "make_s": round(make_s, 1),
            "load_s": round(load_s, 1), "load_peak_mib": round(load_mib), "compare_s": round(compare_s, 1),
            "compare_peak_mib": round(compare_mib), "reduce_s": round(reduce_s, 1),
            "reduce_target_runs": result.invocations["target"], "final": list(result.kept_nodes),
            "s_per_target_run": round(reduce_s / max(1, result.invocations["target"]), 2),
            "reduce_peak_mib": round(reduce_mib)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--large-nodes", type=int, default=None, help="nodes of the large host (default 50,000)")
    parser.add_argument("--large-budget", type=int, default=12, help="candidate runs of the large reduction")
    parser.add_argument("--weights-gb", type=float, default=None, help="external weights of the huge model (2.2)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["triage", "candidates", "large", "huge"])
    args = parser.parse_args()
    count, nodes = (4, 150) if args.quick else (20, 400) if args.full else (10, 300)
    large = args.large_nodes or (3000 if args.quick else 50000)
    gigabytes = args.weights_gb or (0.25 if args.quick else 2.2)
    print(describe_machine())
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if "triage" not in args.skip:
            data["triage"] = bench_triage(tmp, count, nodes)
            print_table("triage throughput (local executor)", ["workers", "models", "seconds", "models/hour", "bugs"],
                        [[r["workers"], r["models"], r["seconds"], r["models_per_hour"], r["distinct_bugs"]]
                         for r in data["triage"]])
        if "candidates" not in args.skip:
            data["candidates"] = bench_candidates(tmp, nodes * 3)
            print_table("candidate throughput (one reduction)", ["workers", "nodes", "target runs", "seconds",
                        "runs/s", "final"], [[r["workers"], r["nodes"], r["target_runs"], r["seconds"],
                                              r["runs_per_s"], r["final_nodes"]] for r in data["candidates"]])
        if "large" not in args.skip:
            data["large"] = bench_large_host(tmp, large, args.large_budget)
            print_table("large host network", list(data["large"]), [list(data["large"].values())])
        if "huge" not in args.skip:
            data["huge"] = bench_huge_weights(tmp, gigabytes)
            print_table("external weights beyond 2 GB", list(data["huge"]), [list(data["huge"].values())])
    write_json(args.json, data)


if __name__ == "__main__":
    main()
