"""Find the optimization pass behind a regression between two ONNX Runtime versions.

Both versions run side by side without installing them in one place: graphbisect runs each backend in a
worker process, and `python=` names the interpreter (a venv) it runs under:

    python -m venv /opt/ort-old && /opt/ort-old/bin/pip install numpy onnxruntime==1.20.1
    python examples/culprit_pass.py model.onnx --old /opt/ort-old/bin/python

The old version is the oracle, the new one (this interpreter's) the target. `passes` asks the target which
passes fired on the model and delta-debugs them: the culprits (a 1-minimal set whose disabling removes the
failure), the passes that reproduce it alone, and the workaround spec. Then the model is reduced with only
those passes enabled, and repro.py runs a control with them disabled.

Without --old (no second venv here) the "old version" is the same ONNX Runtime with its graph optimizations
off (`opt_level=disable`), the new one `opt_level=all`: the same search, over the passes that fired. The
default model is ORT's keepdims=0 LayerNorm pattern (onnxruntime#30513), which two fusions get wrong.
"""

from __future__ import annotations

import argparse
import sys

import graphbisect as gb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="ONNX model (default: the keepdims=0 LayerNorm pattern)")
    parser.add_argument("--old", metavar="PYTHON", help="interpreter of a venv with the old ONNX Runtime")
    parser.add_argument("-o", "--output", default="culprit-pass-bug", help="bundle of the reduced model")
    args = parser.parse_args()
    if args.old:
        oracle = f"onnxruntime:opt_level=all,python={args.old}"
        target = "onnxruntime:opt_level=all"
    else:
        oracle, target = "onnxruntime:opt_level=disable", "onnxruntime:opt_level=all"
    model = args.model
    if model is None:
        from graphbisect.examples.patterns import pattern_model

        model = pattern_model("layernorm_keepdims0")

    found = gb.passes(model, oracle=oracle, target=target)
    if not found.failed:
        print(f"{target} agrees with {oracle}: no regression")
        return 0
    print(f"fired on this model: {len(found.fired)} passes")
    print(f"culprits (disable these): {', '.join(found.culprits) or '-'}")
    print(f"reproduce on their own:  {', '.join(found.each_alone) or '-'}")
    print(f"workaround: --target '{found.fixed_target}'")
    # The same search, then a reduction under only the required passes (repro.py also runs the control).
    bug = gb.reduce(model, args.output, oracle=oracle, target=target, passes=True, force=True)
    print(f"reduced under {found.culprit_target}: {bug.final_nodes} nodes; bundle {bug.bundle}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
