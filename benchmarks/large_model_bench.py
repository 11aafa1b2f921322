"""Peak memory of `compare` and `reduce` on a model whose external weights exceed 2 GB.

The model (:func:`build_chain`) is a chain of ``--layers`` square MatMul/Gemm layers (width ``--width``,
float32, written straight into ``model.onnx.data``: they are never all in memory, not even here) with a
residual tap in the middle that projects the stream to ``[8, 8]``, runs the decomposed LayerNorm with
``ReduceMean(keepdims=0)`` that ONNX Runtime's LayerNormFusion miscompiles (onnxruntime#30513, the
bug of :func:`graphbisect.examples.host_network`) and adds the result back. Target ORT ``opt_level=all``,
oracle ORT ``opt_level=disable`` (the defaults): the target's output is wrong, so ``compare`` fails and
``reduce`` finds the LayerNorm's few nodes.

Each operation runs in a **fresh process** (so every peak is that operation's own) and includes
``load_model``:

* ``load``: :func:`graphbisect.model.load_model` alone;
* ``compare``: ``compare_models(layerwise=False)`` (one plain run per backend: what ``triage`` does);
* ``compare+layerwise``: the same plus one probed run per backend exposing every intermediate tensor;
* ``reduce``: ``reduce_model`` with the default options, down to the 1-minimal bundle.

Memory: the main (graphbisect) process's peak RSS (``getrusage(RUSAGE_SELF)``, exact), the largest
backend worker's (its ``VmHWM``, read every 10 ms while it lives: ``RUSAGE_CHILDREN`` would charge each
worker with the main process's RSS at the time it was spawned) and main + workers resident at one time
(/proc sampled every 10 ms by this script's parent process, so no GIL hides a spike). Disk: bytes the
work folder *added* (hard links to the user's weights count nothing).

Run: ``python benchmarks/large_model_bench.py [--quick | --full] [--weights-gib G] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import MemorySampler, add_size_args, describe_machine, mib, print_table, write_json
from onnx import TensorProto, helper

from graphbisect.examples import GraphBuilder
from graphbisect.examples.patterns import IR_VERSION, OPSET, layernorm_keepdims0

OPERATIONS = ("load", "compare", "compare+layerwise", "reduce")
ROWS = 8  # tokens: x is float32[ROWS, width]
_ALIGN = 4096


def build_chain(folder: Path, *, width: int, layers: int, seed: int = 0) -> tuple[Path, Path]:
    """Write ``model.onnx`` + ``model.onnx.data`` (``layers`` × width² float32 weights) and ``inputs.npz``.

    Layer ``i`` is ``MatMul`` + ``Add`` (bias) for even ``i`` and ``Gemm`` (``transB=1``) for odd ``i``,
    scaled by 1/sqrt(width) so the stream keeps its magnitude. After layer ``layers // 2`` the stream is
    projected to ``[8, 8]``, normalized by the buggy LayerNorm and projected back as a residual update.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data_path = folder / "model.onnx.data"
    b = GraphBuilder(seed=seed)
    stubs: list[TensorProto] = []
    with data_path.open("wb") as out:

        def big(name: str, shape: tuple[int, ...], scale: float) -> str:
            start = -(-out.tell() // _ALIGN) * _ALIGN
            out.write(b"\0" * (start - out.tell()))
            rows_per_chunk = max(1, (16 << 20) // (4 * shape[-1]))
            for first in range(0, shape[0], rows_per_chunk):
                count = min(rows_per_chunk, shape[0] - first)
                chunk = rng.standard_normal((count, *shape[1:]), dtype=np.float32) * np.float32(scale)
                out.write(chunk.tobytes())
            stub = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape,
                               data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data_path.name), ("offset", start),
                               ("length", int(np.prod(shape)) * 4)):
                stub.external_data.add(key=key, value=str(value))
            stubs.append(stub)
            return name

        h = "x"
        for i in range(layers):
            with b.scope(f"layer{i}"):
                weight = big(f"layer{i}.weight", (width, width), width ** -0.5)
                bias = b.const((0.01 * rng.standard_normal(width)).astype(np.float32), "bias")
                if i % 2 == 0:
                    h = b.op("Add", [b.op("MatMul", [h, weight]), bias])
                else:
                    h = b.op("Gemm", [h, weight, bias], transB=1)
            if i == layers // 2:
                with b.scope("tap"):
                    down = b.op("MatMul", [h, big("tap.down", (width, ROWS), width ** -0.5)])
                    normed = layernorm_keepdims0(b, down, width=ROWS, gamma_seed=seed)
                    up = b.op("MatMul", [normed, big("tap.up", (ROWS, width), 1.0)])
                    h = b.op("Add", [h, up])
    y_node = b.nodes[-1]
    y_node.output[0] = "y"
    b.initializers.extend(stubs)
    model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, width])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, width])],
                    graph_name="big_chain", doc="external weights beyond 2 GB + LayerNorm keepdims=0")
    assert model.opset_import[0].version == OPSET and model.ir_version == IR_VERSION
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    inputs = folder / "inputs.npz"
    np.savez(inputs, x=rng.standard_normal((ROWS, width), dtype=np.float32))
    return path, inputs


# ------------------------------------------------------------------------------------------ child process


def _added_disk_bytes(folder: Path) -> int:
    """Disk blocks of files under ``folder`` that exist only there (a hard link to the user's file adds none)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            stat = os.lstat(os.path.join(root, name))
            if stat.st_nlink == 1:
                total += stat.st_blocks * 512
    return total


def _run(operation: str, model_path: Path, inputs_path: Path, work: Path) -> dict[str, Any]:
    from graphbisect.model import load_model
    from graphbisect.workflows.compare import compare_models
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model

    with np.load(inputs_path) as data:
        feeds = {name: data[name] for name in data.files}
    started = time.perf_counter()
    model = load_model(model_path)
    info: dict[str, Any] = {"load_s": time.perf_counter() - started, "nodes": len(model.nodes)}
    if operation.startswith("compare"):
        result = compare_models(model, inputs=feeds, workdir=work / "compare", layerwise=operation != "compare")
        info.update(result="pass" if result.passed else "fail", invocations=dict(result.invocations),
                    added_disk_bytes=_added_disk_bytes(work / "compare"))
    elif operation == "reduce":
        reduced = reduce_model(model, work / "bundle", inputs=feeds, options=ReduceOptions(keep_work=True))
        bundle_model = work / "bundle" / "model.onnx"
        info.update(result=f"{reduced.final_nodes} nodes" + (", 1-minimal" if reduced.one_minimal else ""),
                    invocations=dict(reduced.invocations), kept=list(reduced.kept_nodes),
                    bundle_model_bytes=bundle_model.stat().st_size,
                    added_disk_bytes=_added_disk_bytes(work / "bundle.work"))
    return info


def measure_here(operation: str, model_path: Path, inputs_path: Path, work: Path) -> dict[str, Any]:
    """Run ``operation`` in this (fresh) process; its wall time and exact peak RSS."""
    started = time.perf_counter()
    info = _run(operation, model_path, inputs_path, work)
    wall = time.perf_counter() - started
    kib = 1024  # ru_maxrss is in KiB on Linux
    return {**info, "operation": operation, "wall_s": wall,
            "main_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib}


# ----------------------------------------------------------------------------------------- parent process


def measure(operation: str, model_path: Path, inputs_path: Path, root: Path) -> dict[str, Any]:
    """One measurement of ``operation`` in a fresh Python process (its work folder removed afterwards)."""
    work = Path(tempfile.mkdtemp(prefix=f"{operation}-", dir=root))
    try:
        command = [sys.executable, __file__, "--child", operation, str(model_path), str(inputs_path), str(work)]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child, \
                MemorySampler(root=child.pid) as sampler:
            stdout, stderr = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"{operation} failed:\n{stderr[-3000:]}")
        result = dict(json.loads(stdout.strip().splitlines()[-1]))
        return {**result, "tree_peak_bytes": sampler.peak_bytes, "worker_peak_bytes": sampler.worker_peak_bytes}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rows(results: Sequence[dict[str, Any]], weights_bytes: int) -> list[list[str]]:
    table = []
    for r in results:
        runs = "/".join(str(v) for v in r.get("invocations", {}).values()) or "-"
        worker = f"{mib(r['worker_peak_bytes']):.0f}" if r["worker_peak_bytes"] else "-"
        added = f"{mib(r['added_disk_bytes']):.0f}" if "added_disk_bytes" in r else "-"
        table.append([r["operation"], f"{r['wall_s']:.1f}", f"{r['load_s']:.1f}", f"{mib(r['main_peak_bytes']):.0f}",
                      f"{r['main_peak_bytes'] / weights_bytes:.2f}", worker, f"{mib(r['tree_peak_bytes']):.0f}",
                      runs, added, r.get("result", "-")])
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--weights-gib", type=float,
                        help="external weights (default 2.25 GiB; 0.06 with --quick, 4.5 with --full)")
    parser.add_argument("--width", type=int, help="layer width (default 8192; 1024 with --quick)")
    parser.add_argument("--operations", nargs="+", choices=OPERATIONS, default=list(OPERATIONS))
    parser.add_argument("--dir", type=Path, help="where to build the model (default: a temporary folder; the "
                        "disk needs ~3x the weights)")
    parser.add_argument("--child", nargs=4, metavar=("OP", "MODEL", "INPUTS", "WORK"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        operation, model, inputs, work = args.child
        print(json.dumps(measure_here(operation, Path(model), Path(inputs), Path(work))))
        return 0
    gib = args.weights_gib or (0.0625 if args.quick else 4.5 if args.full else 2.25)
    width = args.width or (1024 if args.quick else 8192)
    layers = max(2, round(gib * 2**30 / (4 * width * width)))
    root = Path(tempfile.mkdtemp(prefix="large-model-bench-", dir=args.dir))
    try:
        started = time.perf_counter()
        model_path, inputs_path = build_chain(root / "model", width=width, layers=layers)
        build_s = time.perf_counter() - started
        weights = (root / "model" / "model.onnx.data").stat().st_size
        print(f"built {layers} layers of width {width}: {weights / 1e9:.2f} GB of external weights "
              f"({mib(weights):.0f} MiB) in {build_s:.0f} s", file=sys.stderr, flush=True)
        results = []
        for operation in args.operations:
            results.append(measure(operation, model_path, inputs_path, root))
            print(f"measured {operation}", file=sys.stderr, flush=True)
        untouched = (root / "model" / "model.onnx.data").stat().st_size == weights
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"external weights: {mib(weights):.0f} MiB ({weights / 1e9:.2f} GB), {layers} layers of width {width}; "
          f"{describe_machine()}")
    print_table("Wall time (s), peak resident memory (MiB), backend runs and disk", [
        "operation", "wall s", "load s", "main", "main/weights", "worker", "main+workers", "runs o/t",
        "disk MiB", "result"], rows(results, weights), left_last=True,
        notes=["main: peak RSS of the graphbisect process; worker: the largest backend worker's; main+workers: "
               "their peak sum at one time (sampled every 10 ms)",
               "disk MiB: bytes the work folder added (hard links to the user's weights count nothing)"])
    write_json(args.json, {"benchmark": "large_model", "weights_bytes": weights, "width": width, "layers": layers,
                           "user_files_untouched": untouched, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
