"""repro.py's ONNX Runtime session (onnxruntime and onnxoptimizer sections share one) is graphbisect's own.

Before: each section rebuilt the SessionOptions itself from the spec's ``config`` only, so the runtime's
default ``session.intra_op.allow_spinning=0`` was missing from the session "created exactly as graphbisect did".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphbisect.artifacts import write_bundle
from graphbisect.backends.onnxruntime import OnnxRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from artifacts_builders import LN_INPUT, build_content, layernorm_model, run_repro
from test_artifacts_repro_backends import pad_maxpool_model

KEYS = ("session.intra_op.allow_spinning", "session.disable_prepacking")
DRIVER = """
import json, runpy, sys
from pathlib import Path
bundle = Path(sys.argv[1])
ns = runpy.run_path(str(bundle / "repro.py"), run_name="repro")
options = ns["read_config"]()["options"]
ns["import_library"](options)
so = ns["load_target"](bundle / "model.onnx", options).get_session_options()
def entry(key):
    try:
        return so.get_session_config_entry(key) or None
    except Exception:
        return None
print(json.dumps({"threads": so.intra_op_num_threads, "level": str(so.graph_optimization_level),
                  "config": {key: entry(key) for key in KEYS}}))
""".replace("KEYS", repr(KEYS))


def _graphbisects_session(options: dict[str, str], model: Path, tmp: Path) -> dict[str, object]:
    runtime = OnnxRuntime(options, str(tmp))
    runtime.load(str(model), None)
    so = runtime._session.get_session_options()

    def entry(key: str) -> str | None:
        try:
            return so.get_session_config_entry(key) or None
        except Exception:
            return None

    return {"threads": so.intra_op_num_threads, "level": str(so.graph_optimization_level),
            "config": {key: entry(key) for key in KEYS}}


PADS_INPUT = -1.0 - np.abs(np.random.default_rng(0).standard_normal((1, 2, 4, 4))).astype(np.float32)


@pytest.mark.parametrize(("target", "session", "case"), [
    ("onnxruntime:opt_level=basic,threads=2,config=session.disable_prepacking=1",
     {"opt_level": "basic", "threads": "2", "config": "session.disable_prepacking=1"},
     (layernorm_model, {"x": LN_INPUT})),  # ORT's LayerNormFusion ignores keepdims=0
    ("onnxoptimizer:passes=fuse_pad_into_pool,threads=2", {"opt_level": "disable", "threads": "2"},
     (pad_maxpool_model, {"x": PADS_INPUT})),  # onnxoptimizer folds a zero Pad into MaxPool
], ids=["onnxruntime", "onnxoptimizer"])
def test_repro_creates_the_session_graphbisect_created(target: str, session: dict[str, str], case: tuple,  # type: ignore[type-arg]
                                                       tmp_path: Path) -> None:
    if target.startswith("onnxoptimizer"):
        pytest.importorskip("onnxoptimizer")
    build, inputs = case
    content = build_content(build(), inputs, tmp_path / "case", target=target)
    if not content.signature.failed:
        pytest.skip(f"{target} computes this model right here")
    bundle = write_bundle(content, tmp_path / "bundle")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script must not need graphbisect
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(bundle)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == _graphbisects_session(session, bundle / "model.onnx", tmp_path / "rt")
    ran = run_repro(bundle)  # the whole script, without graphbisect
    assert ran.returncode == 1 and "REPRODUCED" in ran.stdout, ran.stdout + ran.stderr
