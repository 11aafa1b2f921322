"""Plug in your own runtime: a class implementing graphbisect's Runtime protocol gets every command.

A compiler team's runtime usually lives in its own package and is registered by an entry point, so that
`graphbisect compare --target mycompiler` works from the shell too (pyproject.toml of that package):

    [project.entry-points."graphbisect.backends"]
    mycompiler = "mycompiler.graphbisect_runtime:MyCompilerRuntime"

In a script, `graphbisect.register_backend(MyRuntime)` does the same for this process. Either way the class
runs in graphbisect's isolated worker processes (a crash or a hang of your compiler is a result, not a dead
run), which import it by module path: keep this script's own work under `if __name__ == "__main__":`.

Here the "compiler" is ONNX Runtime at a chosen optimization level, so the example runs anywhere; replace
`load` and `run` with your compiler's build and execute.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

import graphbisect as gb


class TeamRuntime:
    """ONNX Runtime at a chosen optimization level (stands for a team's own compiler)."""

    # What the backend can do: run ONNX models, and expose any intermediate tensor as an output (which makes
    # the layerwise comparison and evidence-guided reduction possible).
    capabilities: ClassVar[tuple[str, ...]] = ("onnx-input", "intermediates")
    # Documented spec options: `--target teamrt:level=extended`. Others are refused with this list.
    options: ClassVar[dict[str, str]] = {"level": "graph optimization level: basic|extended|all (default all)"}
    # The options whose values cannot run a program, load a library or write a file (the trust rule of
    # docs/security.md): a bundle recording `teamrt:level=all` verifies without --trust. An option left out
    # (a dump folder, a plug-in path) makes a downloaded bundle that sets it need --trust.
    inert_options: ClassVar[dict[str, str]] = {"level": "any"}

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        # Runs inside the worker process; import your compiler's library lazily (in load) if it is heavy.
        self.level = options.get("level", "all")
        self.session: Any = None
        self.outputs: list[str] = []

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Build an executable for the ONNX file ``model`` producing ``outputs`` (None: the model's own)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                       "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[self.level]
        self.session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        self.outputs = list(outputs) if outputs else [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, dict(inputs))))

    def info(self) -> dict[str, Any]:
        """Facts about the build, kept in the report (versions, flags, what was compiled)."""
        import onnxruntime as ort

        return {"library": "onnxruntime", "library_version": ort.__version__, "level": self.level}


def main() -> int:
    from graphbisect.examples.patterns import pattern_model

    gb.register_backend(TeamRuntime, name="teamrt")
    model = sys.argv[1] if len(sys.argv) > 1 else pattern_model("layernorm_keepdims0")
    out = sys.argv[2] if len(sys.argv) > 2 else "teamrt-bug"

    found = gb.compare(model, target="teamrt:level=all")
    print(f"teamrt vs ONNX Runtime without optimizations: {'pass' if found.passed else 'FAIL'}")
    if found.layerwise is not None and found.layerwise.first_divergence is not None:
        print(f"first divergence: {found.layerwise.first_divergence.node}")
    if found.passed:
        return 0
    bug = gb.reduce(model, out, target="teamrt:level=all", force=True)
    print(f"reduced to {bug.final_nodes} nodes: {', '.join(bug.kept_nodes)}; bundle {bug.bundle}")
    # The bundle is replayed with the same backend: `verify` needs teamrt registered (or installed).
    print(f"verify: {gb.verify(bug.bundle).outcome}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
