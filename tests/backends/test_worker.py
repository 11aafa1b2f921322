"""The worker's side of a layerwise probe: comparing a run's outputs with the oracle's activation store there.

The old path wrote every probed target tensor to a file and compared it in the host; the worker now compares
it against the store and returns only the statistics. These tests hold the two to the same table — rows,
first divergence, root causes, the probed verdict — on real failing models and real backends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.backends.process import CompareTo
from graphbisect.compare import Tolerance
from graphbisect.compare.metrics import comparison_of
from graphbisect.data import ActivationStore
from graphbisect.errors import GraphBisectError
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.localize.layerwise import analyze_layers, tensor_stats
from graphbisect.model import load_model
from graphbisect.model.io import save_proto
from graphbisect.workflows.probe import compiled_of, describing_spec, discard_description, plan_probe


def _both_paths(target: str, tmp_path: Path, *, all_tensors: bool = False) -> tuple[dict, dict]:
    """The layerwise table of one target probe computed both ways: values dumped and compared here (old), and
    statistics measured in the worker against the store (new)."""
    model = load_model(example_model_path())
    inputs = example_inputs_path()
    tol = Tolerance()
    outputs = set(model.output_names)
    every = [n for n in model.intermediate_names() if n not in outputs]
    save_proto(model.with_outputs(every), tmp_path / "probe.onnx")
    model.save(tmp_path / "model.onnx")
    with BackendProcess("onnxruntime:opt_level=disable", workdir=tmp_path / "o") as oracle:
        assert oracle.run(tmp_path / "probe.onnx", inputs, output_dir=tmp_path / "store").ok
    store = ActivationStore.open(tmp_path / "store")
    spec = BackendSpec.parse(target)
    described = None if all_tensors else describing_spec(spec)
    with BackendProcess(described or spec, workdir=tmp_path / "t") as proc:
        plain = proc.run(tmp_path / "model.onnx", inputs)
        assert plain.ok, plain.describe()
        compiled = compiled_of(model, plain.info) if described is not None else None
        discard_description(plain.info)
        plan = plan_probe(model, compiled, among=store)
        save_proto(model.with_outputs(list(plan.names)), tmp_path / "probe-target.onnx")
        dumped = proc.run(tmp_path / "probe-target.onnx", inputs, output_dir=tmp_path / "dump")
        measured = proc.run(tmp_path / "probe-target.onnx", inputs, compare_to=CompareTo(store.directory, tol))
    assert dumped.ok and measured.ok
    assert set(measured.stats) == set(dumped.outputs) and not measured.outputs  # statistics only
    tables = []
    for values, stats in ((dumped.outputs, None), (None, measured.stats)):
        report = analyze_layers(model.nodes, store, values, tol, compiled=compiled, measured=stats)
        verdict = comparison_of(tensor_stats(name, store, values, tol, stats) for name in model.output_names)
        tables.append({
            "rows": [row.to_json() for row in report.rows],
            "first": None if report.first_divergence is None else report.first_divergence.to_json(),
            "causes": [cause.to_json() for cause in report.root_causes],
            "probed_verdict": [s.to_json() for s in verdict.outputs], "passed": verdict.passed})
    return tables[0], tables[1]


def test_worker_statistics_give_the_table_of_the_dumped_values_on_ort(tmp_path: Path) -> None:
    """The bundled LayerNorm bug on ONNX Runtime's compiled-graph probe: the fused LayerNormalization diverges."""
    old, new = _both_paths("onnxruntime:opt_level=all", tmp_path)
    assert old == new
    assert new["first"] is not None and new["first"]["compiled_as"]["kind"] == "LayerNormalization"
    assert not new["passed"] and any(row["kind"] == "not-observed" for row in new["rows"])  # fused-away tensors


def test_worker_statistics_under_probe_masking(tmp_path: Path) -> None:
    """Every tensor exposed: ORT no longer fuses, the probed verdict passes (probe masking) — in both paths."""
    old, new = _both_paths("onnxruntime:opt_level=all", tmp_path, all_tensors=True)
    assert old == new
    assert new["passed"] and new["first"] is None


@pytest.mark.openvino
def test_worker_statistics_give_the_table_of_the_dumped_values_on_openvino(tmp_path: Path) -> None:
    """The same bug on OpenVINO's execution graph: an MVN normalizing the wrong axis."""
    pytest.importorskip("openvino")
    old, new = _both_paths("openvino", tmp_path)
    assert old == new
    assert new["first"] is not None and new["first"]["compiled_as"]["kind"] == "MVN"


def test_a_damaged_store_is_an_error_not_a_target_crash(tmp_path: Path) -> None:
    model = load_model(example_model_path())
    model.save(tmp_path / "model.onnx")
    (tmp_path / "store").mkdir()
    with BackendProcess("onnxruntime", workdir=tmp_path / "t") as proc, pytest.raises(GraphBisectError) as caught:
        proc.run(tmp_path / "model.onnx", example_inputs_path(), compare_to=CompareTo(tmp_path / "store", Tolerance()))
    assert "activation store" in str(caught.value)


def test_the_worker_compares_with_numpy_only() -> None:
    """The comparison runs in workers, maybe under an interpreter without onnx: it must not import it."""
    code = ("import sys, numpy as np, tempfile, pathlib\n"
            "from graphbisect.backends.worker import compare_to_store, write_outputs\n"
            "d = pathlib.Path(tempfile.mkdtemp()); write_outputs({'y': np.ones(2)}, ['y'], d)\n"
            "print(compare_to_store({'y': np.ones(2)}, ['y'], d, {'atol': 0, 'rtol': 0})['columns']['kind'][0])\n"
            "print(sorted(m for m in ('onnx', 'networkx', 'onnxruntime') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["ok", "[]"], done.stderr


def test_comparing_with_a_large_store_keeps_a_window_of_it_resident(tmp_path: Path) -> None:
    """A layerwise probe's tensors are compared with the oracle's capture in the worker. The capture's pages
    stayed resident as they were read: ~1 GiB of a 1,500-node detector's capture beside the run's own ~1 GiB
    of outputs. Now each window (at most 64 MiB of stored data) is let go before the next. Here 24 tensors of
    16 MiB (384 MiB) are compared in a fresh interpreter; its high-water mark grew by ~390 MiB before."""
    store = ActivationStore(tmp_path / "store")
    for i in range(24):
        store.put(f"t{i}", np.full((1, 64, 256, 256), i, np.float32))
    store.close()
    script = (
        "import json, numpy as np\n"
        "from graphbisect.backends.worker import compare_to_store\n"
        "def hwm():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) * 1024\n"
        "outputs = {f't{i}': np.broadcast_to(np.float32(i), (1, 64, 256, 256)) for i in range(24)}\n"
        "before = hwm()\n"
        f"store = {str(tmp_path / 'store')!r}\n"
        "kinds = compare_to_store(outputs, list(outputs), store, {'atol': 0, 'rtol': 0})['columns']['kind']\n"
        "print(json.dumps({'grown': hwm() - before, 'passed': [kind == 'ok' for kind in kinds]}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["passed"] == [True] * 24  # every tensor compared, and equal
    assert found["grown"] < 160 * 2**20, found  # a window or two of the 384 MiB, not all of it
