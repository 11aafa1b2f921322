"""Triage a folder of failing models (a fuzzing campaign, a nightly model zoo run): one row per distinct bug.

Every *.onnx file and Paddle model folder in INPUT_DIR (with NAME.npz beside it as its inputs) is compared,
its culprit passes searched, reduced and bundled into OUT/bundles/NAME/; then the failures are grouped into
distinct bugs (same failure, same culprit passes, same reduced pattern up to names and constants).
OUT/summary.md, .json and .html list them; re-running on the same OUT skips finished models.

Without INPUT_DIR it writes a demo folder, OUT-demo-models: two copies of ORT's keepdims=0 LayerNorm bug with different
weights, one FuseReluClip crash, and one healthy model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

import graphbisect as gb


def demo_folder(folder: Path) -> Path:
    from graphbisect.examples.patterns import pattern_model

    folder.mkdir(parents=True, exist_ok=True)
    for name, pattern, seed in (("ln_a", "layernorm_keepdims0", 0), ("ln_b", "layernorm_keepdims0", 1),
                                ("clip", "relu_clip_f64", 0), ("healthy", "layernorm_keepdims1", 0)):
        onnx.save(pattern_model(pattern, seed=seed), folder / f"{name}.onnx")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input_dir", nargs="?", help="folder of models (default: a demo folder)")
    parser.add_argument("-o", "--output", default="triage-out")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="models triaged at once")
    parser.add_argument("--executor", default="local", help="local, ray, or ray:ADDRESS for a cluster")
    args = parser.parse_args()
    # the demo models sit beside OUT, not in it: triage refuses an OUT holding files it did not write
    output = Path(args.output)
    folder = Path(args.input_dir) if args.input_dir else demo_folder(output.with_name(output.name + "-demo-models"))

    result = gb.triage(folder, args.output, executor=args.executor, jobs=args.jobs)
    failed = result.by_status("failed")
    print(f"{len(result.outcomes)} models: {len(failed)} failing, {len(result.bugs)} distinct bugs")
    for bug in result.bugs:
        culprits = f" [{', '.join(bug.culprits)}]" if bug.culprits else ""
        print(f"  x{bug.count} {bug.signature.get('kind')}{culprits}: {' -> '.join(bug.op_types)}; "
              f"smallest bundle {bug.smallest_bundle}")
    print(f"summary: {result.summary['md']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
