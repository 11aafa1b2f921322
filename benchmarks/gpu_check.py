"""graphbisect on ONNX Runtime's CUDA execution provider: one table of what each command finds on a real GPU.

Runs ``compare``, ``reduce``, ``passes`` and ``precision`` with ``--target onnxruntime:providers=
CUDAExecutionProvider;CPUExecutionProvider`` (oracle: ONNX Runtime on the CPU without optimizations) on the
bundled example and on the LayerNormFusion keepdims=0 bug in hosts of 200 and 400 nodes, with the CUDA EP's
default TF32 and with ``cuda.use_tf32=0``. The CUDA EP computes MatMul/Conv in TF32 by default, so every
matrix product differs from the CPU's: the target's **noise floor** (its error with optimizations off), which
graphbisect measures and judges failures above. Columns: what ran, target runs, the node count (or the
answer), the failure's identity / culprits / verdict, and the floor.

Needs an NVIDIA GPU and ``onnxruntime-gpu``; without them it says so and exits 0.
Run: ``bash benchmarks/gpu_check.sh [--json PATH]`` (or ``python benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import graphbisect as gb
from graphbisect.examples import host_network
from graphbisect.examples.bundled import example_inputs_path, example_model_path

CUDA = "onnxruntime:providers=CUDAExecutionProvider;CPUExecutionProvider"


def _cases(folder: Path) -> list[tuple[str, Path, dict[str, np.ndarray]]]:
    cases = [("example", Path(example_model_path()), dict(np.load(example_inputs_path())))]
    for nodes, position in ((200, "main"), (400, "branch")):
        host = host_network(nodes, bug="layernorm_keepdims0", position=position, seed=nodes)
        path = folder / f"ln-{nodes}.onnx"
        path.write_bytes(host.model.SerializeToString())
        cases.append((f"ln-{nodes}-{position}", path, dict(host.inputs)))
    return cases


def _identity(record: dict[str, Any]) -> str:
    """A bundle's identity in a cell: the node where it first goes wrong and what the target made there."""
    if record.get("matched_by") != "identity":
        return "by kind"
    made = record.get("compiled_kind") or "-"
    return f"{record['node']} ({made}{' by ' + record['made_by'] if record.get('made_by') else ''})"


def _floor(note: str | None) -> str:
    return (note or "-")[:60]


def run(out: Path, targets: tuple[str, ...]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label, model, inputs in _cases(out):
        for target in targets:
            tag = "fp32" if "use_tf32=0" in target else "tf32"
            started = time.perf_counter()
            found = gb.compare(model, target=target, inputs=inputs)
            first = found.layerwise.first_divergence if found.layerwise else None
            rows.append({"case": label, "math": tag, "command": "compare", "runs": found.invocations["target"],
                         "result": str(found.outcome.cls.value),
                         "identity": "-" if first is None else f"{first.node} "
                         f"({first.compiled_as.kind if first.compiled_as else first.op_type})",
                         "floor": _floor(found.noise_floor.describe() if found.noise_floor else None),
                         "seconds": round(time.perf_counter() - started, 1)})
            started = time.perf_counter()
            try:
                reduced = gb.reduce(model, out / f"{label}-{tag}", target=target, inputs=inputs, force=True)
                report = json.loads((out / f"{label}-{tag}" / "report.json").read_text())
                rows.append({"case": label, "math": tag, "command": "reduce",
                             "runs": reduced.invocations["target"], "result": f"{reduced.final_nodes} nodes, "
                             f"{'1-minimal' if reduced.one_minimal else 'not proven'}",
                             "identity": _identity(report["identity"]),
                             "floor": _floor(report["noise_floor"].get("note")),
                             "seconds": round(time.perf_counter() - started, 1)})
            except gb.GraphBisectError as exc:
                rows.append({"case": label, "math": tag, "command": "reduce", "runs": "-",
                             "result": f"stopped: {exc.message[:60]}", "identity": "-", "floor": "-",
                             "seconds": round(time.perf_counter() - started, 1)})
            started = time.perf_counter()
            passes = gb.passes(model, target=target, inputs=inputs)
            rows.append({"case": label, "math": tag, "command": "passes", "runs": passes.invocations["target"],
                         "result": f"disable {'+'.join(passes.culprits) or '-'}; enable "
                         f"{'+'.join(passes.required) or '-'}",
                         "identity": str(passes.scope.get("compiled_as", "-")).split(" ←")[0],
                         "floor": "-", "seconds": round(time.perf_counter() - started, 1)})
    started = time.perf_counter()
    from graphbisect.examples.precision_models import cnn_inputs, residual_cnn

    kept = gb.precision(residual_cnn(), target=targets[0], inputs=cnn_inputs())
    rows.append({"case": "precision-example", "math": "fp16", "command": "precision",
                 "runs": kept.invocations.get("target", "-"),
                 "result": f"{len(kept.keep_fp32)} FP32 nodes, "
                 f"{'meets the tolerance' if kept.meets_tolerance else 'DOES NOT meet the tolerance'}",
                 "identity": "-", "floor": "-", "seconds": round(time.perf_counter() - started, 1)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    parser.add_argument("--stand-in", action="store_true",
                        help="run on the CPU with the TF32 stand-in (graphbisect/examples/tf32_target.py) instead of "
                        "the CUDA EP: checks this script, measures nothing about a GPU")
    args = parser.parse_args()
    import onnxruntime as ort

    if args.stand_in:
        from graphbisect.examples.tf32_target import register

        register()
        targets: tuple[str, ...] = ("tf32ort:opt_level=all",)
    else:
        targets = (CUDA, f"{CUDA},cuda.use_tf32=0")
    if not args.stand_in and "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"no CUDA execution provider here (onnxruntime {ort.__version__} at {ort.__file__}: "
              f"{ort.get_available_providers()}); install onnxruntime-gpu on a machine with an NVIDIA GPU")
        return 0
    print(f"onnxruntime {ort.__version__} ({ort.__file__}); providers {ort.get_available_providers()}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        rows = run(Path(tmp), targets)
    headers = ("case", "math", "command", "runs", "result", "identity", "floor", "seconds")
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) for h in headers}
    print(" | ".join(h.ljust(widths[h]) for h in headers))
    print("-+-".join("-" * widths[h] for h in headers))
    for row in rows:
        print(" | ".join(str(row[h]).ljust(widths[h]) for h in headers))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
