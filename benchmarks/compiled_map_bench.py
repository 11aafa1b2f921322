"""How much of ONNX Runtime's compiled graph `compare` maps back to the original model, on the onnx wheel's
light zoo models (resnet50, densenet121, shufflenet, inception_v1: real architectures, constant weights).

Per model: the nodes of ORT's optimized model (``opt_level=all``, this CPU's NCHWc kernels), split into layout
reorders (``ReorderInput``/``ReorderOutput``: they compute nothing) and computing nodes; how many computing
nodes are mapped to the original tensor they compute; the surviving tensors and the ones the probe exposes;
whether ORT builds the probe model (the surviving tensors exposed) with the same computing nodes as the plain
model (the probe's premise); a check **by value** of every mapped blocked (NCHWc) tensor: the optimized model
run with that tensor exposed, unblocked, against the original tensor it is mapped to (a wrong mapping shows
here); and `compare`'s verdict (ORT all vs ORT disable) with the number of tensors it compared.

Counts are deterministic on one CPU kind (the NCHWc block size and which kernels exist depend on it). Run it
with ``PYTHONPATH`` on two checkouts for a before/after pair (the value check needs the after code's
``graphbisect.localize.optimized``; it is skipped, ``-``, without it).

    python benchmarks/compiled_map_bench.py [--models resnet50 densenet121 shufflenet inception_v1] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, print_table, write_json

from graphbisect.examples import light_models
from graphbisect.localize.compiled import compiled_graph
from graphbisect.model import Model, load_model
from graphbisect.workflows.compare import compare_models
from graphbisect.workflows.probe import plan_probe

MODELS = ("resnet50", "densenet121", "shufflenet", "inception_v1")
LAYOUT = frozenset({"ReorderInput", "ReorderOutput"})


def _build(path: Path, saved: Path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(saved)
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(saved), load_external_data=False)


def _computing(proto: onnx.ModelProto) -> collections.Counter[tuple[object, ...]]:
    """The optimized model's computing nodes: domain, op, attributes, input count (layout reorders left out)."""
    return collections.Counter(
        (n.domain, n.op_type, tuple(sorted((a.name, str(helper.get_attribute_value(a))) for a in n.attribute)),
         len(n.input)) for n in proto.graph.node if n.op_type not in LAYOUT)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _value_mismatches(model: Model, optimized: onnx.ModelProto, folder: Path) -> tuple[int, int] | None:
    """(blocked tensors checked, mismatched): each optimized tensor mapped to an original tensor of another
    name, exposed on the optimized model (run as saved, optimizations off), unblocked and compared."""
    if importlib.util.find_spec("graphbisect.localize.optimized") is None:
        return None
    from graphbisect.localize.optimized import optimized_tensors

    found = optimized_tensors(model.nodes, optimized.graph, {t.name: t for t in model.proto.graph.initializer})
    claims = {node.output[0]: outputs[0] for node, (_, _, outputs) in zip(optimized.graph.node, found.named,
                                                                          strict=True)
              if outputs and node.output[0] not in outputs}
    if not claims:
        return 0, 0
    replay = onnx.ModelProto()
    replay.CopyFrom(optimized)
    read = {name for node in replay.graph.node for name in node.input}
    kept = [v for v in replay.graph.input if v.name in read or v.name in model.input_names]
    del replay.graph.input[:]
    replay.graph.input.extend(kept)  # ORT keeps the inputs of IR 3 initializers it folded away
    replay.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in claims)
    onnx.save(replay, str(folder / "replay.onnx"))
    onnx.save(model.with_outputs(list(dict.fromkeys(claims.values()))), str(folder / "probe-disable.onnx"))
    rng = np.random.default_rng(0)
    reference = _session(folder / "probe-disable.onnx")
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
             for i in reference.get_inputs() if i.name in model.input_names}
    wanted = list(dict.fromkeys(claims.values()))
    want = dict(zip(wanted, reference.run(wanted, feeds), strict=True))
    got = dict(zip(claims, _session(folder / "replay.onnx").run(list(claims), feeds), strict=True))

    def matches(block: int) -> int:
        bad = 0
        for token, original in claims.items():
            value, expected = got[token], want[original]
            n, c, h, w = value.shape
            if c % block:
                bad += 1
                continue
            value = value.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3).reshape(n, c, h, w)
            bad += not np.allclose(value[:, :expected.shape[1]], expected, rtol=1e-3, atol=1e-3)
        return bad

    return len(claims), min(matches(block) for block in (8, 16))  # MLAS's NCHWc block: AVX2 8, AVX-512 16


def measure(name: str) -> dict[str, Any]:
    model = load_model(light_models()[name])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model.save(folder / "m.onnx")
        optimized = _build(folder / "m.onnx", folder / "opt.onnx")
        takes_constants = "constants" in inspect.signature(compiled_graph).parameters
        extra = {"constants": {t.name: t for t in model.proto.graph.initializer}} if takes_constants else {}
        graph = compiled_graph(model.nodes, model.output_names, {"optimized_model": str(folder / "opt.onnx")}, **extra)
        assert graph is not None
        plan = plan_probe(model, graph)
        onnx.save(model.with_outputs(list(plan.names)), str(folder / "probe.onnx"))
        same = _computing(optimized) == _computing(_build(folder / "probe.onnx", folder / "probe-opt.onnx"))
        unmapped = set(graph.unmapped)
        layout = sum(n.op_type in LAYOUT for n in optimized.graph.node)
        computing = len(optimized.graph.node) - layout
        lost = sum(1 for n in optimized.graph.node if n.op_type not in LAYOUT and (n.name or n.op_type) in unmapped)
        checked = _value_mismatches(model, optimized, folder)
    result = compare_models(model)
    layers = result.layerwise
    assert layers is not None and result.target_probe is not None
    return {"model": name, "optimized": len(optimized.graph.node), "layout": layout, "computing": computing,
            "mapped": computing - lost, "unmapped": lost, "surviving": len(graph.surviving), "probed": len(plan.names),
            "probe_build_same": same, "value_checked": None if checked is None else checked[0],
            "value_mismatched": None if checked is None else checked[1],
            "verdict": "pass" if result.passed else "FAIL", "first_divergence": layers.first_divergence is not None,
            "compared": layers.compared, "target_probe": result.target_probe.ran}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    rows = [measure(name) for name in args.models if name in light_models()]
    print_table("ONNX Runtime's compiled graph mapped back to the original model (ORT all, this CPU)",
                ["model", "optimized", "layout", "computing", "mapped", "unmapped", "surviving", "probed",
                 "probe build same", "value checked", "mismatched", "verdict", "divergence", "compared", "probe"],
                [[r["model"], r["optimized"], r["layout"], r["computing"], r["mapped"], r["unmapped"], r["surviving"],
                  r["probed"], r["probe_build_same"], "-" if r["value_checked"] is None else r["value_checked"],
                  "-" if r["value_mismatched"] is None else r["value_mismatched"], r["verdict"],
                  "yes" if r["first_divergence"] else "-", r["compared"], r["target_probe"]] for r in rows],
                notes=[describe_machine()])
    write_json(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
