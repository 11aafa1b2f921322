"""Keep a minimal set of nodes in FP32 when the rest runs in fp16, bf16 or int8.

For each mode, `precision` finds a 1-minimal set of ONNX nodes that must stay FP32 for the outputs to stay
within tolerance of the FP32 oracle (by ONNX node name, verified at the end), and writes the overrides each
runtime needs into OUT/MODE/: trtexec --layerPrecisions, ORT quantization nodes_to_exclude, the
float16-converter node_block_list, Paddle and OpenVINO settings, and the mixed-precision model.

Without a model it uses graphbisect's precision example: a residual CNN whose block3 has activations of
~1e5 that overflow fp16 (its three nodes must stay FP32; int8 also needs the classifier head).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import graphbisect as gb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="ONNX model (default: the precision example CNN)")
    parser.add_argument("--modes", default="fp16,bf16,int8", help="comma-separated modes")
    parser.add_argument("--atol", type=float, default=1e-2)
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("-o", "--output", default="fp32-sets", help="overrides per mode go to OUTPUT/MODE/")
    args = parser.parse_args()
    model, inputs = args.model, None
    if model is None:
        from graphbisect.examples.precision_models import cnn_inputs, residual_cnn

        model, inputs = residual_cnn(), cnn_inputs()
    model = gb.load_model(model)  # load once, use for every mode

    answers = {}
    for mode in args.modes.split(","):
        found = gb.precision(model, mode=mode, inputs=inputs, atol=args.atol, rtol=args.rtol, prefix=False,
                             output=Path(args.output) / mode)
        answers[mode] = list(found.keep_fp32)
        status = "meets" if found.meets_tolerance else "DOES NOT meet"
        print(f"{mode}: keep {len(found.keep_fp32)} of {len(found.units)} nodes in FP32 "
              f"({', '.join(found.keep_fp32) or 'none'}); {status} the tolerance; "
              f"{found.invocations['target']} target runs")
    Path(args.output).mkdir(parents=True, exist_ok=True)
    (Path(args.output) / "keep_fp32.json").write_text(json.dumps(answers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
