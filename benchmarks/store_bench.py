"""The activation store on disk: files, bytes, write, read and delete times of one oracle capture.

For ``host_network(N)`` (5,000 and 50,000 nodes by default) the oracle (ONNX Runtime, ``opt_level=disable``)
runs the probe model exposing every intermediate tensor into an output folder, exactly as ``reduce`` and
``compare --layerwise`` capture the activation store. Then, on that folder:

* ``files``, ``MiB`` (sum of file sizes) and ``on disk`` (allocated blocks);
* ``capture s``: the oracle's probe run (``BackendProcess.run``: ORT plus the worker writing its outputs,
  fsynced as ``reduce`` has them where the code can: ``durable=True``);
* ``write s``: the worker's writer alone (``write_outputs`` of the same values into a fresh folder);
  ``durable s``: the same with ``durable=True`` (fsync of the data and the index), where the code has it;
* ``open ms`` / ``read all s``: ``ActivationStore.open`` and ``get`` of every tensor (what the layerwise
  analysis does); ``get us``: mean of 2,000 ``get`` calls on random tensors of a reopened store (what a
  candidate's cut-point feeds cost);
* ``rmtree s``: ``shutil.rmtree`` of the folder (the end of every reduction without ``--keep-work``).

Each measurement runs in a fresh process whose ``PYTHONPATH`` is one of ``--code`` (label=folder), so the
code before and after a change is measured alternately in one run on one machine.

Run: ``python benchmarks/store_bench.py [--quick] [--sizes 5000 50000] [--repeats N]
[--code before=/path/to/old/checkout after=.] [--json PATH]``
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_size_args, describe_machine, dir_size, mib, print_table, write_json


def measure(nodes: int, root: Path) -> dict[str, Any]:
    """One capture of ``host_network(nodes)`` under ``root`` and what its store costs (runs in a child)."""
    import numpy as np

    from graphbisect.backends import BackendProcess
    from graphbisect.backends.worker import write_outputs

    durable = "durable" in inspect.signature(write_outputs).parameters  # the code measured may predate it
    fsynced: dict[str, Any] = {"durable": True} if durable else {}
    from graphbisect.data import ActivationStore
    from graphbisect.examples import host_network
    from graphbisect.model import load_model, save_proto

    host = host_network(nodes, bug=None)
    model = load_model(host.model)
    probe = root / "probe.onnx"
    save_proto(model.with_outputs(model.intermediate_names()), probe)
    store_dir = root / "activations"
    with BackendProcess("onnxruntime:opt_level=disable", workdir=root / "oracle", timeout=900) as proc:
        started = time.perf_counter()
        run = proc.run(probe, dict(host.inputs), output_dir=store_dir, **fsynced)
        capture = time.perf_counter() - started
    assert run.ok, run.describe()
    size = dir_size(store_dir)

    started = time.perf_counter()
    store = ActivationStore.open(store_dir)
    opened = time.perf_counter() - started
    names = store.names()
    started = time.perf_counter()
    values = {}
    for name in names:
        value = store.get(name)
        values[name] = np.array(value)  # touch every byte, as the layerwise statistics do
    read_all = time.perf_counter() - started

    copy_dir = root / "rewritten"
    started = time.perf_counter()
    write_outputs(values, names, copy_dir)
    write = time.perf_counter() - started
    shutil.rmtree(copy_dir)
    write_durable = None
    if durable:
        started = time.perf_counter()
        write_outputs(values, names, copy_dir, durable=True)
        write_durable = time.perf_counter() - started
        shutil.rmtree(copy_dir)

    reopened = ActivationStore.open(store_dir)
    picks = random.Random(0).choices(names, k=2000)
    started = time.perf_counter()
    for name in picks:
        reopened.get(name)
    get_us = (time.perf_counter() - started) / len(picks) * 1e6
    del store, reopened, values

    started = time.perf_counter()
    shutil.rmtree(store_dir)
    rmtree = time.perf_counter() - started
    return {"nodes": nodes, "tensors": len(names), "files": size.files, "bytes": size.apparent_bytes,
            "disk_bytes": size.disk_bytes, "capture_s": capture, "write_s": write,
            "durable_s": write_durable, "open_ms": opened * 1e3,
            "read_all_s": read_all, "get_us": get_us, "rmtree_s": rmtree}


def _child(nodes: int, base: Path | None) -> int:
    with tempfile.TemporaryDirectory(prefix="store-bench-", dir=base) as tmp:
        print(json.dumps(measure(nodes, Path(tmp))))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_size_args(parser)
    parser.add_argument("--sizes", type=int, nargs="+", help="node counts (default 5000 50000; --quick: 2000)")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per size and code (median)")
    parser.add_argument("--code", nargs="+", default=["this=."], metavar="LABEL=DIR",
                        help="checkouts to measure alternately (PYTHONPATH of each child)")
    parser.add_argument("--dir", type=Path, help="where the stores are written (default: the temp folder)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child, args.dir)
    sizes = args.sizes or ([2000] if args.quick else [5000, 50000])
    codes = [entry.split("=", 1) for entry in args.code]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for nodes in sizes:
        for _ in range(args.repeats):
            for label, code in codes:  # alternating: before, after, before, after...
                env = {**os.environ, "PYTHONPATH": str(Path(code).resolve())}
                command = [sys.executable, __file__, "--child", str(nodes)]
                if args.dir:
                    command += ["--dir", str(args.dir)]
                proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
                if proc.returncode:
                    raise SystemExit(f"{label} at {nodes} nodes failed:\n{proc.stderr[-3000:]}")
                results.setdefault((nodes, label), []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"{label} {nodes}: {results[(nodes, label)][-1]}", file=sys.stderr)
    keys = ("capture_s", "write_s", "open_ms", "read_all_s", "get_us", "rmtree_s")
    rows = []
    summary = []
    for (nodes, label), runs in results.items():
        first = runs[0]
        med = {key: statistics.median(run[key] for run in runs) for key in keys}
        durables = [run["durable_s"] for run in runs if run.get("durable_s") is not None]
        med["durable_s"] = statistics.median(durables) if durables else None
        summary.append({"nodes": nodes, "code": label, "runs": runs, "median": med})
        rows.append([label, nodes, first["tensors"], first["files"], f"{mib(first['bytes']):.1f}",
                     f"{mib(first['disk_bytes']):.1f}", f"{med['capture_s']:.2f}", f"{med['write_s']:.2f}",
                     "-" if med["durable_s"] is None else f"{med['durable_s']:.2f}",
                     f"{med['open_ms']:.0f}", f"{med['read_all_s']:.2f}", f"{med['get_us']:.0f}",
                     f"{med['rmtree_s']:.2f}"])
    print_table(f"Activation store of one oracle capture (median of {args.repeats})",
                ["code", "nodes", "tensors", "files", "MiB", "on disk MiB", "capture s", "write s", "durable s",
                 "open ms", "read all s", "get us", "rmtree s"], rows, left=1,
                notes=[describe_machine()])
    write_json(args.json, {"results": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
