"""What `graphbisect compare` costs on a ~5,000-node model, against two plain runs of the same backends.

Models (``--models``): ``host`` and ``host-bug`` (:func:`graphbisect.examples.host_network`, without and with
the keepdims=0 LayerNorm bug), ``wide`` (:func:`graphbisect.examples.wide_model`), ``chain``
(:func:`chain_model`: a chain of elementwise nodes on a ``[1, 256]`` tensor, where compare's per-node and
per-tensor costs are all there is), and three real conv nets in ONNX Runtime's NCHWc layout: ``ocr-det`` and
``ocr-rec`` (PP-OCRv4, 672 and 860 nodes, :func:`ocr_model`, ~50 million activation values to compare) and
``densenet121`` (1,746 nodes, :func:`densenet_model`).

Three ways to run the default backends (target ``onnxruntime:opt_level=all``, oracle
``onnxruntime:opt_level=disable``) on the same model and inputs, each in a **fresh process** so that peak
memory is that run's alone:

* ``compare+layerwise``: :func:`graphbisect.compare` (the public API: it loads the model, as the CLI does, and
  calls :func:`graphbisect.workflows.compare.compare_models`) with ``layerwise=True`` (the
  oracle's one run captures every intermediate tensor, at the same time as the target's plain run; then the
  target's probe exposing only the tensors that survive in the graph ONNX Runtime compiled,
  ``save_optimized=1``, compared with the oracle's store in the target's worker);
* ``compare+all-tensors``: the same with ``all_tensors=True``: the target's probe exposes every tensor too
  (the probe before the compiled-graph probe);
* ``compare``: the same with ``layerwise=False`` (one run per backend);
* ``baseline``: two plain ``onnxruntime.InferenceSession`` runs (optimizations disabled, then all) in one
  process: the least any comparison of these two backends can cost.
* ``floor``: the least a layerwise comparison *through the target's compiled graph* can cost, as
  ``compare+layerwise`` does it, but in one process, on two threads, with nothing else
  (:func:`_run_floor`): the oracle's session with every intermediate exposed beside the target's plain
  session (saving its optimized model) and then that optimized model with its tensors exposed (the replay),
  three ``onnxruntime.InferenceSession`` builds; every tensor both ran compared by its largest difference.
  No worker processes (compare's isolation from a backend that crashes or hangs), no mapping of the compiled
  graph, no store, no statistics beyond one maximum: what is left of ``compare+layerwise`` above it is graphbisect's.

Wall time starts before importing graphbisect (or onnxruntime for the baseline) and includes loading the
model, so worker start-up is charged to graphbisect. graphbisect runs each backend in a worker process, so
memory is reported three ways: the main process's peak (``getrusage(RUSAGE_SELF)``, exact), the largest
worker's peak (``RUSAGE_CHILDREN``: the largest single child, exact), and the peak of main + workers
resident *at the same time* (``MemorySampler``: /proc sampled every 10 ms). ``cpu s`` is the user + system
CPU time of the process and its workers: on a shared machine it moves far less than wall time (compare runs
its two backends concurrently, which saves wall time, not CPU); the sampler's own thread is not counted
(``sampler_cpu_s`` in the JSON: ~0.1 s per second of wall time). Ratios are against the baseline.
For the layerwise run the table below gives the activation stores on disk: the oracle's (kept for
``reduce``) and the target's dump (none since the target's worker compares with the oracle's store), file
count, bytes, and bytes on disk (4 KiB blocks per file).

Run: ``python benchmarks/compare_bench.py [--quick | --full] [--repeats N] [--models ...] [--modes ...] [--json PATH]``
(the modes run in rounds: one run of each, then the next round, so a load that changes meanwhile weighs on all).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _common import (
    MemorySampler,
    add_size_args,
    describe_machine,
    dir_size,
    median,
    mib,
    print_table,
    write_json,
)
from onnx import TensorProto, helper, numpy_helper

from graphbisect.backends import zygote
from graphbisect.examples import host_network, light_models, wide_model

MODES = ("compare+layerwise", "compare+all-tensors", "compare", "baseline", "floor")
Built = tuple[onnx.ModelProto, dict[str, np.ndarray]]

#: The chain's repeating unit: (op, constant operand or None).
_CHAIN_UNIT = (("Add", 0.001), ("Mul", 1.0001), ("Relu", None), ("Sub", 0.001), ("Tanh", None))


def chain_model(nodes: int, width: int = 256) -> Built:
    """``x[1, width]`` through ``nodes`` elementwise nodes (Add, Mul, Relu, Sub, Tanh, repeated), one
    constant ``[1, width]`` initializer per Add/Mul/Sub (3 of 5 nodes, two distinct values): every tensor is
    small, so what compare costs above two plain runs is per node and per tensor, not arithmetic."""
    shape = [1, width]
    nodes_out, constants, previous = [], [], "x"
    for i in range(nodes):
        op, value = _CHAIN_UNIT[i % len(_CHAIN_UNIT)]
        inputs = [previous]
        if value is not None:
            constants.append(numpy_helper.from_array(np.full(shape, value, np.float32), f"c{i}"))
            inputs.append(f"c{i}")
        nodes_out.append(helper.make_node(op, inputs, [f"t{i}"], name=f"n{i}"))
        previous = f"t{i}"
    graph = helper.make_graph(nodes_out, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, shape)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": np.random.RandomState(0).rand(*shape).astype(np.float32)}


def _host(built: Any) -> Built:
    return built.model, dict(built.inputs)


#: The real models: PP-OCRv4 text detection (672 nodes) and recognition (860 nodes), from the
#: rapidocr-onnxruntime wheel (a dev dependency), at one input shape each.
OCR_SHAPES = {"ocr-det": (1, 3, 320, 320), "ocr-rec": (1, 3, 48, 320)}


def densenet_model(_nodes: int) -> Built:
    """onnx's light DenseNet-121 (1,746 nodes; the real architecture, constant weights) at 1×3×224×224."""
    model = onnx.load(str(light_models()["densenet121"]))
    weights = {t.name for t in model.graph.initializer}
    (data,) = [i for i in model.graph.input if i.name not in weights]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    return model, {data.name: np.random.RandomState(0).rand(*shape).astype(np.float32)}


def ocr_model(name: str) -> Built:
    """PP-OCRv4's ``det`` or ``rec`` model (``OCR_SHAPES``) with a uniform random input."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        sys.exit("rapidocr-onnxruntime is not installed (pip install -e '.[dev]')")
    model = onnx.load(str(Path(spec.origin).parent / "models" / f"ch_PP-OCRv4_{name[4:]}_infer.onnx"))
    return model, {"x": np.random.RandomState(0).rand(*OCR_SHAPES[name]).astype(np.float32)}


BUILDERS: dict[str, Callable[[int], Built]] = {
    "host": lambda n: _host(host_network(n, bug=None)),
    # The keepdims=0 LayerNorm bug on the main path: probing every tensor masks it.
    "host-bug": lambda n: _host(host_network(n, bug="layernorm_keepdims0", position="main")),
    "wide": lambda n: _host(wide_model(n)),
    "chain": chain_model,
    **{name: lambda _nodes, name=name: ocr_model(name) for name in OCR_SHAPES},  # their own node count
    "densenet121": densenet_model,
}


@dataclass(frozen=True)
class ModelCase:
    """A benchmark model saved to disk with its inputs."""

    name: str
    nodes: int
    path: Path
    inputs: Path


def build_case(name: str, nodes: int, root: Path) -> ModelCase:
    """Build ``BUILDERS[name](nodes)`` and save the model and its inputs under ``root``."""
    model, inputs = BUILDERS[name](nodes)
    nodes = len(model.graph.node)  # a real model's own
    folder = root / f"{name}-{nodes}"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    np.savez(folder / "inputs.npz", **inputs)
    return ModelCase(name, nodes, folder / "model.onnx", folder / "inputs.npz")


# ------------------------------------------------------------------------------------------ child process


def _run_compare(model_path: Path, inputs: dict[str, np.ndarray], workdir: Path, mode: str) -> dict[str, Any]:
    import graphbisect

    # all_tensors only where asked: a checkout from before it (46d2cbc, the issue 14 baseline) probes every tensor
    result = graphbisect.compare(model_path, inputs=inputs, layerwise=mode != "compare", workdir=workdir,
                                 **({"all_tensors": True} if mode == "compare+all-tensors" else {}))
    layers = result.layerwise
    first = layers.first_divergence if layers is not None else None
    return {"passed": result.passed, "invocations": dict(result.invocations), "note": result.layerwise_note,
            "compared": layers.compared if layers is not None else 0, "probe_masking": result.probe_masking,
            "first_divergence": None if first is None else
            (first.compiled_as.describe(limit=1) if first.compiled_as is not None else first.node)}


def _run_baseline(model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    import onnxruntime as ort

    outputs = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, inputs))
    passed = all(np.allclose(t, o, rtol=1e-3, atol=1e-4) for o, t in zip(*outputs, strict=True))
    return {"passed": passed, "invocations": {"oracle": 1, "target": 1}, "note": None, "compared": 0,
            "probe_masking": False, "first_divergence": None}


def _exposing(source: onnx.ModelProto, names: Sequence[str], types: dict[str, int]) -> bytes:
    """A copy of ``source`` with ``names`` (those of them ``types`` types and its nodes compute) added as graph
    outputs, each declared with its element type and no shape (a blocked NCHWc tensor then comes back blocked)."""
    model = onnx.ModelProto()
    model.CopyFrom(source)
    computed = {out for node in model.graph.node for out in node.output}
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(name, types[name], None) for name in names
                              if name in computed and name in types and name not in present)
    return model.SerializeToString()


def _in_threads(*jobs: Callable[[], None]) -> None:
    """Run ``jobs`` each in a thread of its own and wait for them all; raise the first one's error."""
    failed: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> Callable[[], None]:
        def work() -> None:
            try:
                job()
            except BaseException as exc:  # raised again below, in the measuring thread
                failed.append(exc)
        return work

    threads = [threading.Thread(target=guarded(job)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]


def _run_floor(model_path: Path, inputs: dict[str, np.ndarray], workdir: Path) -> dict[str, Any]:
    """The ``floor`` mode (module docstring): the oracle's capture session on one thread, the target's plain
    session and then its replay on another, and the largest difference of every tensor both ran."""
    import onnxruntime as ort

    def session(model: str | bytes, level: Any, save: Path | None = None) -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        if save is not None:
            options.optimized_model_filepath = str(save)
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    original = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    types = {v.name: v.type.tensor_type.elem_type for v in [*original.graph.value_info, *original.graph.output]
             if v.type.HasField("tensor_type")}
    names = [out for node in original.graph.node for out in node.output if out]
    values: dict[str, dict[str, np.ndarray]] = {}

    def run(side: str, built: Any) -> None:
        # an optimized model may read as inputs what the original holds as initializers (onnx's light models)
        weights = {w.name: w for w in original.graph.initializer}
        feeds = {i.name: inputs[i.name] if i.name in inputs else numpy_helper.to_array(weights[i.name])
                 for i in built.get_inputs()}
        values[side] = dict(zip([o.name for o in built.get_outputs()], built.run(None, feeds), strict=True))

    def oracle() -> None:
        run("oracle", session(_exposing(original, names, types), ort.GraphOptimizationLevel.ORT_DISABLE_ALL))

    def target() -> None:
        saved = workdir / "optimized.onnx"
        run("plain", session(str(model_path), ort.GraphOptimizationLevel.ORT_ENABLE_ALL, saved))
        replay = _exposing(onnx.load(str(saved)), names, types)
        run("replay", session(replay, ort.GraphOptimizationLevel.ORT_DISABLE_ALL))

    _in_threads(oracle, target)
    oracle_values, replay = values["oracle"], values["replay"]
    compared = [name for name in replay if name in oracle_values and replay[name].shape == oracle_values[name].shape]
    for name in compared:
        float(np.max(np.abs(replay[name].astype(np.float64) - oracle_values[name]), initial=0.0))
    passed = all(np.allclose(values["plain"][o.name], oracle_values[o.name], rtol=1e-3, atol=1e-4)
                 for o in original.graph.output)
    return {"passed": passed, "invocations": {"oracle": 1, "target": 2}, "note": None, "compared": len(compared),
            "probe_masking": False, "first_divergence": None}


def measure_here(mode: str, model_path: Path, inputs_path: Path, workdir: Path) -> dict[str, Any]:
    """Run ``mode`` in this (fresh) process and return its wall time, peaks and disk use."""
    with np.load(inputs_path) as data:
        inputs = {name: data[name] for name in data.files}
    with MemorySampler() as sampler:
        started = time.perf_counter()
        if mode == "baseline":
            info = _run_baseline(model_path, inputs)
        elif mode == "floor":
            info = _run_floor(model_path, inputs, workdir)
        else:
            info = _run_compare(model_path, inputs, workdir, mode)
        wall = time.perf_counter() - started
    zygote.close_all()  # the workers it forked are counted in RUSAGE_CHILDREN once it is reaped
    kib = 1024  # ru_maxrss is in KiB on Linux
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        **info, "mode": mode, "wall_s": wall, "tree_peak_bytes": sampler.peak_bytes, "samples": sampler.samples,
        # CPU seconds of this process and its (reaped) workers: far less sensitive to a loaded machine than wall;
        # without the memory sampler's own thread, which costs in proportion to the wall time it watches
        "cpu_s": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime - sampler.cpu_seconds,
        "sampler_cpu_s": sampler.cpu_seconds,
        "main_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
        "worker_peak_bytes": (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib
                              if mode.startswith("compare") else 0),
        "oracle_store": dir_size(workdir / "activations").to_json(),
        "target_dump": dir_size(workdir / "target-activations").to_json(),
        "workdir": dir_size(workdir).to_json(),
    }


# ----------------------------------------------------------------------------------------- parent process


def measure(case: ModelCase, mode: str) -> dict[str, Any]:
    """One measurement of ``mode`` on ``case`` in a fresh Python process (so peaks are its own)."""
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as work:
        command = [sys.executable, __file__, "--child", mode, str(case.path), str(case.inputs), work]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{mode} on {case.name}-{case.nodes} failed:\n{done.stderr[-3000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median wall time and the largest peaks over repeated runs of one mode."""
    first = runs[0]
    return {
        "mode": first["mode"], "repeats": len(runs), "passed": first["passed"], "invocations": first["invocations"],
        "compared": first["compared"], "probe_masking": first["probe_masking"],
        "first_divergence": first["first_divergence"],
        "wall_s": median([r["wall_s"] for r in runs]), "wall_all_s": [round(r["wall_s"], 3) for r in runs],
        "cpu_s": median([r["cpu_s"] for r in runs]),
        "sampler_cpu_s": median([r["sampler_cpu_s"] for r in runs]),
        **{key: max(r[key] for r in runs) for key in ("main_peak_bytes", "worker_peak_bytes", "tree_peak_bytes")},
        "oracle_store": first["oracle_store"], "target_dump": first["target_dump"], "workdir": first["workdir"],
    }


def time_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for entry in results:
        base = next(s for s in entry["modes"] if s["mode"] == "baseline")
        for s in entry["modes"]:
            worker = f"{mib(s['worker_peak_bytes']):.0f}" if s["worker_peak_bytes"] else "-"
            rows.append([entry["model"], str(entry["nodes"]), s["mode"], f"{s['wall_s']:.2f}",
                         f"{s['wall_s'] / base['wall_s']:.1f}x",
                         f"{s['cpu_s']:.2f}", f"{s['cpu_s'] / base['cpu_s']:.1f}x",
                         f"{mib(s['main_peak_bytes']):.0f}", worker,
                         f"{mib(s['tree_peak_bytes']):.0f}", f"{s['tree_peak_bytes'] / base['tree_peak_bytes']:.1f}x",
                         "/".join(str(v) for v in s["invocations"].values()), "pass" if s["passed"] else "FAIL",
                         str(s["compared"] or "-"), "yes" if s["probe_masking"] else "-"])
    return rows


def divergence_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[entry["model"], str(entry["nodes"]), s["mode"], str(s["first_divergence"])]
            for entry in results for s in entry["modes"] if s["mode"].startswith("compare+")]


def disk_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for entry in results:
        for s in entry["modes"]:
            if not s["mode"].startswith("compare+"):
                continue
            for label in ("oracle_store", "target_dump", "workdir"):
                size = s[label]
                rows.append([entry["model"], str(entry["nodes"]), s["mode"], label.replace("_", " "),
                             str(size["files"]), f"{mib(size['apparent_bytes']):.1f}",
                             f"{mib(size['disk_bytes']):.1f}"])
    return rows


def _measure_modes(case: ModelCase, modes: Sequence[str], repeats: int) -> list[dict[str, Any]]:
    """Each of ``modes`` ``repeats`` times on ``case``, one round of every mode after another (a load that
    changes meanwhile weighs on every mode alike), summarized per mode; baseline always included."""
    chosen = list(dict.fromkeys([*modes, "baseline"]))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in chosen}
    for _ in range(repeats):
        for mode in chosen:
            runs[mode].append(measure(case, mode))
    return [summarize(runs[mode]) for mode in chosen]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--repeats", type=int, help="runs per mode; the median wall time is reported "
                        "(default 3, 1 with --quick)")
    parser.add_argument("--models", nargs="+", choices=sorted(BUILDERS),
                        help="default: host host-bug wide (chain only when named)")
    parser.add_argument("--modes", nargs="+", choices=MODES, help=f"default: all ({' '.join(MODES)}); the "
                        "ratios need baseline")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "MODEL", "INPUTS", "WORKDIR"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        mode, model, inputs, work = args.child
        print(json.dumps(measure_here(mode, Path(model), Path(inputs), Path(work))))
        return 0
    sizes = (1000,) if args.quick else (5000, 10000, 20000) if args.full else (5000,)
    names = args.models or (["host"] if args.quick else ["host", "host-bug", "wide"])
    repeats = args.repeats or (1 if args.quick else 3)
    results = []
    with tempfile.TemporaryDirectory(prefix="compare-bench-models-") as root:
        for nodes in sizes:
            for name in names:
                case = build_case(name, nodes, Path(root))
                modes = _measure_modes(case, args.modes or MODES, repeats)
                results.append({"model": name, "nodes": case.nodes, "modes": modes})
                print(f"measured {name}-{nodes}", file=sys.stderr, flush=True)
    print(f"compare vs two plain ONNX Runtime runs ({describe_machine()}); median of {repeats} run(s)")
    print_table("Wall time and peak resident memory (MiB)",
                ["model", "nodes", "run", "wall s", "x base", "cpu s", "x base", "main", "worker", "main+workers",
                 "x base",
                 "runs o/t", "verdict", "compared", "masking"], time_rows(results), left=3,
                notes=["cpu s: user+system CPU seconds of the main process and its workers (median)",
                       "main: peak RSS of the main process; worker: peak RSS of the largest worker process;",
                       "main+workers: peak of their sum at one time (sampled every 10 ms); runs o/t: oracle/target "
                       "backend runs; compared: tensors in the layerwise table; masking: probe masking reported"])
    print_table("First divergence", ["model", "nodes", "run", "first divergence"], divergence_rows(results), left=3)
    print_table("Activation stores on disk after the layerwise runs", ["model", "nodes", "run", "what", "files",
                "MiB", "MiB on disk"], disk_rows(results), left=4)
    write_json(args.json, {"benchmark": "compare", "repeats": repeats, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
