"""``repro_min.py``: the short, pasteable script an upstream issue wants, beside the robust ``repro.py``.

It builds the reduced model inline with ``onnx.helper`` (weights and inputs inline, exact: a float32 printed
as Python's shortest float repr reads back as the same float32), runs the oracle and the target the way the
bundle's specs do, and asserts that they agree — so the assertion fails (or the target raises) while the bug
is there. Only numpy, onnx and the backend's library are needed. Its exit status is ``repro.py``'s contract:
1 while the bug reproduces (an assertion, or the target raising: Python's own exit 1 for an uncaught
exception), 0 once fixed, 2 when it cannot run (:data:`CANNOT_RUN`: a library missing, an onnx too old to
build the model, the oracle failing) — a missing onnx read as "the bug reproduces" before.

Written only when it can be exact and short: at most :data:`MAX_NODES` nodes and :data:`MAX_ELEMENTS`
values inline, no subgraphs, and both backends among :data:`RUNNERS` with options the script reproduces.
Otherwise :func:`render_repro_min` returns None with the reason (the report says it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphbisect.backends import ort_providers
from graphbisect.backends.base import BackendSpec
from graphbisect.backends.reference import unpatched_differences
from graphbisect.compare import Tolerance

__all__ = ["CANNOT_RUN", "MAX_ELEMENTS", "MAX_NODES", "RUNNERS", "render_repro_min"]

log = logging.getLogger(__name__)

MAX_NODES = 30
MAX_ELEMENTS = 1024
#: The script's exit status when it cannot run here (``repro.py``'s: 0 fixed, 1 reproduces, 2 cannot run).
CANNOT_RUN = 2

_ORT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
               "all": "ORT_ENABLE_ALL"}


def _ort(spec: BackendSpec, var: str) -> tuple[str, list[str]] | None:
    plain = {key for key in spec.options if "." not in key}  # <ep>.<key> provider options are written out
    if plain - {"opt_level", "disabled", "threads", "save_optimized", "report_passes", "timeout", "providers"}:
        return None
    level = _ORT_LEVELS.get(spec.options.get("opt_level", "all"))
    if level is None:
        return None
    providers = ort_providers.providers_of(spec.options)
    lines = [f"def {var}():",
             "    so = ort.SessionOptions()",
             f"    so.graph_optimization_level = ort.GraphOptimizationLevel.{level}"]
    if "threads" in spec.options:
        lines.append(f"    so.intra_op_num_threads = {int(spec.options['threads'])}")
    disabled = spec.option_list("disabled")
    extra = f", disabled_optimizers={disabled!r}" if disabled else ""
    listed = ort_providers.session_providers(providers, ort_providers.provider_options(spec.options))
    lines.append(f"    sess = ort.InferenceSession(model.SerializeToString(), so, providers={listed!r}{extra})")
    if providers != ort_providers.DEFAULT_PROVIDERS:  # ORT falls back to the CPU provider without an error
        lines.append(f"    assert set({list(providers)!r}) <= set(sess.get_providers()), sess.get_providers()")
    lines.append("    return sess.run(None, feeds)")
    return "import onnxruntime as ort", lines


def _reference(spec: BackendSpec, var: str) -> tuple[str, list[str]] | None:
    if set(spec.options) - {"timeout"}:
        return None
    return "from onnx.reference import ReferenceEvaluator", [
        f"def {var}():", "    return ReferenceEvaluator(model).run(None, feeds)"]


def _openvino(spec: BackendSpec, var: str) -> tuple[str, list[str]] | None:
    if set(spec.options) - {"device", "precision", "threads", "report_exec", "timeout"}:
        return None
    config = {"INFERENCE_PRECISION_HINT": spec.options.get("precision", "f32")}
    if "threads" in spec.options:
        config["INFERENCE_NUM_THREADS"] = spec.options["threads"]
    return "import openvino as ov", [
        f"def {var}():",
        "    core = ov.Core()",
        "    compiled = core.compile_model(core.read_model(model.SerializeToString(), b''), "
        f"{spec.options.get('device', 'CPU')!r}, {config!r})",
        "    result = compiled(feeds)",
        "    return [result[out] for out in compiled.outputs]"]


#: Backends whose run the script can write out, by canonical name: (spec, function name) → (import, lines).
RUNNERS: Mapping[str, Callable[[BackendSpec, str], tuple[str, list[str]] | None]] = {
    "onnxruntime": _ort, "reference": _reference, "openvino": _openvino,
}


def render_repro_min(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], *, oracle: BackendSpec,
                     target: BackendSpec, tolerance: Tolerance, crash: bool, title: str) -> tuple[str | None, str]:
    """``(script, why)``: the script, or None and why it is not written (too large, a backend it cannot run)."""
    graph = model.graph
    if len(graph.node) > MAX_NODES:
        return None, f"the reduced model has {len(graph.node)} nodes (more than {MAX_NODES})"
    elements = sum(int(np.prod(t.dims)) for t in graph.initializer) + sum(int(v.size) for v in inputs.values())
    if elements > MAX_ELEMENTS:
        return None, f"its weights and inputs hold {elements} values (more than {MAX_ELEMENTS} inline)"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return None, "the reduced model has subgraphs (If/Loop/Scan)"
    differing = unpatched_differences(model) if "reference" in (oracle.name, target.name) else []
    if differing:
        return None, (f"graphbisect's onnx.reference rounds Cast/CastLike to bfloat16 to nearest even where this "
                      f"onnx truncates ({', '.join(differing[:3])}): a plain ReferenceEvaluator would compute "
                      "otherwise")
    runners = []
    for spec, var in ((oracle, "run_oracle"), (target, "run_target")):
        runner = RUNNERS.get(spec.name)
        made = runner(spec, var) if runner is not None else None
        if made is None:
            return None, f"it cannot write out a run of {spec} (backends: {', '.join(RUNNERS)}, plain options)"
        runners.append(made)
    try:
        feeds = ", ".join(f"{k!r}: {_array(v)}" for k, v in inputs.items())
        body = [*_model_lines(model), f"feeds = {{{feeds}}}"]
    except (TypeError, ValueError) as exc:
        return None, f"a value cannot be written inline ({exc})"
    imports = ["import numpy as np", "import onnx", "from onnx import helper, numpy_helper",
               *sorted({imp for imp, _ in runners})]
    check = ["actual = run_target()  # raises (exit 1) while the target crashes on this model"] if crash else [
        "try:",
        "    expected = run_oracle()",
        "except Exception as exc:  # without the oracle's values nothing was tested",
        "    print(f'repro_min.py cannot run here: the oracle failed: {type(exc).__name__}: {exc}', file=sys.stderr)",
        f"    sys.exit({CANNOT_RUN})",
        "for out, e, a in zip(model.graph.output, expected, run_target()):",
        "    atol, rtol = TOLERANCE.get(out.name, DEFAULT)",
        "    np.testing.assert_allclose(a, e, atol=atol, rtol=rtol, err_msg=f'output {out.name}')",
        "print('target and oracle agree: the bug is fixed')"]
    per_output = {k: tuple(v) for k, v in tolerance.per_output.items()}
    lines = [f'"""{title}', "", f"Target: {target}; oracle: {oracle}. Written by graphbisect; needs only numpy, onnx",
             "and the backends' libraries. Exit status as repro.py's: 1 while the bug reproduces (an assertion, or",
             'the target raising), 0 once fixed, 2 when it cannot run here (nothing was tested)."""',
             "", "import sys",
             "try:  # a library missing, or an onnx that cannot build the model: exit 2",
             *(f"    {x}" for x in (*imports, *body)), "except Exception as exc:",
             "    print(f'repro_min.py cannot run here: {type(exc).__name__}: {exc}', file=sys.stderr)",
             f"    sys.exit({CANNOT_RUN})", "", *runners[0][1], "", *runners[1][1], "",
             f"DEFAULT = ({tolerance.atol!r}, {tolerance.rtol!r})", f"TOLERANCE = {per_output!r}", *check]
    return "\n".join(lines) + "\n", ""


def _model_lines(model: onnx.ModelProto) -> list[str]:
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    lines = ["nodes = ["]
    lines += [f"    {_node(n)}," for n in graph.node]
    lines += ["]", "weights = ["]
    lines += [f"    numpy_helper.from_array({_array(numpy_helper.to_array(t))}, {t.name!r}),"
              for t in graph.initializer]
    lines += ["]"]
    ins = ", ".join(_value_info(v) for v in graph.input if v.name not in inits)
    outs = ", ".join(_value_info(v) for v in graph.output)
    opsets = ", ".join(f"helper.make_opsetid({o.domain!r}, {o.version})" for o in model.opset_import)
    lines += [f"graph = helper.make_graph(nodes, 'repro', [{ins}], [{outs}], weights)",
              f"model = helper.make_model(graph, opset_imports=[{opsets}], ir_version={model.ir_version})",
              "onnx.checker.check_model(model)"]
    return lines


def _node(node: onnx.NodeProto) -> str:
    args = [repr(node.op_type), repr(list(node.input)), repr(list(node.output))]
    if node.name:
        args.append(f"name={node.name!r}")
    if node.domain:
        args.append(f"domain={node.domain!r}")
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            text = f"numpy_helper.from_array({_array(numpy_helper.to_array(value))})"
        elif isinstance(value, bytes):
            text = repr(value.decode())
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            text = repr([v.decode() for v in value])
        elif isinstance(value, (int, float, str, list)):
            text = repr(value)
        else:
            raise TypeError(f"attribute {attr.name} of {node.name or node.op_type} ({type(value).__name__})")
        args.append(f"{attr.name}={text}" if attr.name.isidentifier() else f"**{{{attr.name!r}: {text}}}")
    return f"helper.make_node({', '.join(args)})"


def _value_info(value: onnx.ValueInfoProto) -> str:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise TypeError(f"graph input/output {value.name} is not a tensor")
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim] \
        if tensor.HasField("shape") else None
    elem = onnx.TensorProto.DataType.Name(tensor.elem_type)
    return f"helper.make_tensor_value_info({value.name!r}, onnx.TensorProto.{elem}, {dims!r})"


def _array(value: np.ndarray) -> str:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"dtype {array.dtype}")
    data = array.reshape(-1).tolist()
    return f"np.array({data!r}, dtype=np.{array.dtype.name}).reshape({tuple(array.shape)!r})"
