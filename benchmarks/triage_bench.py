"""Scale-out figures for `graphbisect triage`: model and candidate throughput, and large-model overhead.

1. **triage throughput**: a folder of failing host networks (LayerNorm keepdims=0 bugs at several
   positions/seeds, FuseReluClip crashes) triaged with the local executor and 1, 2 and N worker processes:
   models per hour and distinct bugs found (must not change with the workers);
2. **candidate throughput**: one reduction with 1, 2 and N target workers (``ReduceOptions.jobs``): target
   runs per second, with the same result (final nodes) for every N;
3. **a large model, triaged**: a host network of ``--large-nodes`` nodes (default 50,000) with one
   LayerNorm keepdims=0 bug, triaged by ``triage_one`` (compare, culprit passes, reduce under them, bundle)
   in a fresh process, as a triage executor worker does: wall time per step, backend runs, CPU seconds of
   the triaging process (graphbisect's own overhead) and of its backend workers, and peak memory of both
   (``--profile PATH`` writes a cProfile of it). Models with weights beyond 2 GB: ``large_model_bench.py``.

Run: ``python benchmarks/triage_bench.py [--quick | --full] [--large-nodes N] [--skip ...] [--profile P] [--json P]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MemorySampler, add_size_args, describe_machine, mib, print_table, write_json

from graphbisect.backends import zygote
from graphbisect.examples import host_network
from graphbisect.model import load_model
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


def _save_host(folder: Path, nodes: int) -> tuple[str, Path, Path]:
    host = host_network(nodes, bug="layernorm_keepdims0", position="main")
    folder.mkdir(parents=True, exist_ok=True)
    name = f"host{nodes}"
    onnx.save(host.model, str(folder / f"{name}.onnx"))
    np.savez(folder / f"{name}.npz", **host.inputs)
    return name, folder / f"{name}.onnx", folder / f"{name}.npz"


def large_here(source: Path, inputs: Path, out: Path, profile: Path | None) -> dict[str, Any]:
    """Triage one model in this (fresh) process exactly as a triage executor worker does (``triage_one``)."""
    from graphbisect.workflows import reduce as reduce_workflow
    from graphbisect.workflows.triage import ModelTask, TriageOptions, triage_one

    bundle_seconds = []
    write_bundle = reduce_workflow.write_bundle

    def timed_write_bundle(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return write_bundle(*args, **kwargs)
        finally:
            bundle_seconds.append(time.monotonic() - started)

    reduce_workflow.write_bundle = timed_write_bundle  # type: ignore[assignment]
    task = ModelTask(source.stem, str(source), str(out), TriageOptions(), str(inputs))
    profiler = cProfile.Profile() if profile else None
    started = time.monotonic()
    if profiler is not None:
        profiler.enable()
    outcome = triage_one(task)
    if profiler is not None:
        profiler.disable()
    wall = time.monotonic() - started
    if profiler is not None and profile is not None:
        profiler.dump_stats(str(profile))
    zygote.close_all()  # the workers it forked are counted in RUSAGE_CHILDREN once it is reaped
    self_usage, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    phases = dict(outcome.phases)
    if bundle_seconds and "reduce" in phases:
        phases["bundle"] = sum(bundle_seconds)
        phases["reduce"] -= phases["bundle"]
    return {"status": outcome.status, "message": outcome.message, "nodes": outcome.original_nodes,
            "final_nodes": outcome.final_nodes, "one_minimal": outcome.one_minimal, "culprits": outcome.culprits,
            "invocations": dict(outcome.invocations), "wall_s": wall, "phases": phases, "notes": list(outcome.notes),
            "step_invocations": {step: dict(runs) for step, runs in outcome.step_invocations.items()},
            "main_cpu_s": self_usage.ru_utime + self_usage.ru_stime,
            "workers_cpu_s": children.ru_utime + children.ru_stime,
            "main_peak_bytes": self_usage.ru_maxrss * 1024}


def bench_large_triage(tmp: Path, nodes: int, profile: Path | None) -> dict[str, Any]:
    """Triage a ``nodes``-node host with one LayerNorm keepdims=0 bug in a fresh process (so peaks are its own)."""
    started = time.monotonic()
    _, source, inputs = _save_host(tmp / "large-in", nodes)
    build_s = time.monotonic() - started
    command = [sys.executable, __file__, "--child-large", str(source), str(inputs), str(tmp / "large-out")]
    if profile is not None:
        command += ["--profile", str(profile)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child, \
            MemorySampler(root=child.pid) as sampler:  # sampled from outside: no GIL in the way
        stdout, stderr = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"triage of the {nodes}-node host failed:\n{stderr[-3000:]}")
    result = dict(json.loads(stdout.strip().splitlines()[-1]))
    shutil.rmtree(tmp / "large-out", ignore_errors=True)
    return {"build_s": build_s, **result, "worker_peak_bytes": sampler.worker_peak_bytes,
            "tree_peak_bytes": sampler.peak_bytes}


def large_rows(r: dict[str, Any]) -> list[list[object]]:
    phases = r["phases"]
    steps = [f"{phases.get(k, 0):.0f}" for k in ("load", "compare", "passes", "reduce", "bundle")]
    runs = [f"{v.get('oracle', 0)}/{v.get('target', 0)}" if (v := r["step_invocations"].get(step)) else "-"
            for step in ("compare", "passes", "reduce")]
    result = f"{r['final_nodes']} nodes" + (", 1-minimal" if r["one_minimal"] else "")
    return [[r["nodes"], f"{r['wall_s']:.0f}", *steps, *runs, f"{r['main_cpu_s']:.0f}", f"{r['workers_cpu_s']:.0f}",
             f"{mib(r['main_peak_bytes']):.0f}", f"{mib(r['worker_peak_bytes']):.0f}",
             f"{mib(r['tree_peak_bytes']):.0f}", result]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--large-nodes", type=int, default=None, help="nodes of the large host (default 50,000)")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the large triage (pstats) here")
    parser.add_argument("--skip", nargs="*", default=[], choices=["triage", "candidates", "large"])
    parser.add_argument("--child-large", nargs=3, metavar=("MODEL", "INPUTS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_large:
        source, inputs, out = (Path(a) for a in args.child_large)
        print(json.dumps(large_here(source, inputs, out, args.profile), default=str))
        return
    count, nodes = (4, 150) if args.quick else (20, 400) if args.full else (10, 300)
    large = args.large_nodes or (3000 if args.quick else 50000)
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
            data["large"] = bench_large_triage(tmp, large, args.profile)
            print_table("triage of one large host network (one LayerNorm keepdims=0 bug): seconds, runs, MiB",
                        ["nodes", "wall", "load", "compare", "passes", "reduce", "bundle", "compare o/t",
                         "passes o/t", "reduce o/t", "main CPU",
                         "workers CPU", "main MiB", "worker MiB", "main+workers MiB", "result"],
                        large_rows(data["large"]), left=0,
                        notes=["one triage_one() in a fresh process, as in a triage executor worker; seconds per "
                               "step (reduce excludes the bundle: write_bundle); o/t: oracle/target backend runs",
                               "main CPU / workers CPU: CPU seconds of the triaging process (graphbisect's own "
                               "work) and of its backend workers",
                               "main/worker MiB: peak RSS of the triaging process / of the largest backend worker "
                               "(VmHWM); main+workers: their peak sum at one time (sampled every 10 ms)"])
    write_json(args.json, data)


if __name__ == "__main__":
    main()
