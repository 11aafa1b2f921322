"""The ``openvino`` section of ``repro.py``: OpenVINO, replaying ``tactics.json`` kernel pins like the runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import TACTICS_FILE, ReproBackend
from graphbisect.backends.inert import ANY, BUNDLE_FILE, OPENVINO_CONFIG
from graphbisect.backends.openvino import config_entries
from graphbisect.errors import SpecError

_OV_PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}  # as backends/openvino.py


def _openvino_options(options: Mapping[str, str]) -> dict[str, Any]:
    precision = options.get("precision", "f32").strip().lower()
    if precision not in _OV_PRECISIONS:
        raise SpecError(f"openvino option precision={precision!r} is not one of f32, f16, bf16")
    threads = options.get("threads")
    return {
        "device": options.get("device", "CPU").strip() or "CPU",
        "precision": _OV_PRECISIONS[precision],
        "threads": int(threads) if threads is not None else None,
        # other properties, as the runtime passes them to compile_model (config_entries checks them)
        "config": [list(entry) for entry in config_entries(options.get("config", ""))],
        "tactics": TACTICS_FILE if options.get("tactics") else None,  # the bundle's copy (see tactic_files)
    }


_OPENVINO_CODE = r'''
# -------------------------------------------------------------------------------- the target: OpenVINO
SINK_SUFFIX = "/sink_port_0"  # the ONNX frontend names a graph output's Result "<name>/sink_port_0"


def import_library(options):
    """Import openvino and check the device; returns its version."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise CannotRun(f"openvino is not installed ({exc}); pip install openvino") from exc
    base = options["device"].split(".")[0].split(":")[0].upper()
    devices = ov.Core().available_devices
    if base not in ("AUTO", "HETERO", "MULTI", "BATCH") and not any(d.split(".")[0] == base for d in devices):
        raise CannotRun(f"OpenVINO device {options['device']} is not available here (devices: {devices})")
    return ov.get_version()


def load_target(model_path, options):
    """Read and compile the ONNX model as graphbisect did (device, inference precision, threads, the
    recorded config properties, and the kernel choices of the tactic record next to this script, when
    repro_config.json names one)."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(model_path))
    names = {}  # ONNX output name -> output index
    for index, (result, port) in enumerate(zip(model.get_results(), model.outputs)):
        friendly = result.get_friendly_name()
        if friendly.endswith(SINK_SUFFIX):
            names.setdefault(friendly[: -len(SINK_SUFFIX)], index)
        for name in port.get_names():
            names.setdefault(name, index)
    compiled = compile_ov(core, model, options)
    if options.get("tactics"):
        compiled = pin_tactics(core, model, compiled, options, model_path)
    return compiled, names


def compile_ov(core, model, options):
    config = {"INFERENCE_PRECISION_HINT": options["precision"], **{k: v for k, v in options.get("config") or []}}
    if options["threads"] is not None:
        config["INFERENCE_NUM_THREADS"] = options["threads"]
    try:
        compiled = core.compile_model(model, options["device"], config)
    except RuntimeError as exc:
        if not options.get("config"):
            raise
        raise CannotRun(f"OpenVINO here refuses the recorded config {options['config']}: {exc}") from exc
    try:  # a device without the requested precision compiles in another one, silently
        actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    except Exception:
        actual = None
    if actual is not None and actual != options["precision"]:
        raise CannotRun(f"precision={options['precision']} was recorded, but {options['device']} here computes "
                        f"{actual} (INFERENCE_PRECISION_HINT): this machine cannot replay the recorded run")
    return compiled


# Kernel pins, as graphbisect.backends.openvino replays tactics=: record which kernel the unpinned build gave
# each ONNX node, pin the record's choices that differ (default kernels cannot always be asked for back),
# by writing primitives_priority into the IR XML (the only form the CPU plugin honours), and compile that.
PRECISION_SUFFIX = r"_(?:f32|f16|bf16|i8|u8|i32|i64|fp32|fp16|undef|dynamic)$"
NOT_KERNELS = {"Input", "Output", "Const", "Parameter", "Result"}
OUTPUT_INDEX = r"\.\d+$"  # one ".N" OpenVINO's ConvertPrecision appended to a graph output's node


def pin_tactics(core, model, compiled, options, model_path):
    """The model compiled with the record's differing kernel choices pinned (unchanged when none differ)."""
    import openvino as ov

    try:
        wanted = json.loads((HERE / options["tactics"]).read_text(encoding="utf-8"))["choices"]
    except (OSError, ValueError, KeyError) as exc:
        raise CannotRun(f"cannot read the tactic record {options['tactics']}: {exc}") from exc
    nodes, producers = onnx_names(model_path)
    current = build_choices(compiled, nodes, producers)
    pins, unmapped = ir_pins(wanted, current, ir_layers(model, nodes, producers))
    if unmapped:  # a kernel of fused nodes (Conv + BatchNormalization) exists only after OpenVINO's fusions
        from openvino._offline_transformations import apply_moc_transformations

        fused = model.clone()
        apply_moc_transformations(fused, cf=False)
        fused_pins, fused_unmapped = ir_pins(wanted, current, ir_layers(fused, nodes, producers))
        if len(fused_unmapped) < len(unmapped):
            model, pins, unmapped = fused, fused_pins, fused_unmapped
    if unmapped:
        print(f"note: no OpenVINO layer stands for {unmapped[:5]}: their kernels are not pinned", file=sys.stderr)
    if not pins:
        return compiled
    with tempfile.TemporaryDirectory(prefix="repro-tactics-") as tmp:
        plain, pinned = Path(tmp) / "model.xml", Path(tmp) / "pinned.xml"
        ov.save_model(model, str(plain), compress_to_fp16=False)
        missing = pin_ir_xml(plain, pinned, pins)
        if missing:
            raise RuntimeError(f"OpenVINO's IR has no layer named {', '.join(missing[:5])}")
        compiled = compile_ov(core, core.read_model(str(pinned), str(Path(tmp) / "model.bin")), options)
    now = build_choices(compiled, nodes, producers)
    lost = [c for c in wanted if c["node"] in now and now[c["node"]][1] != c["choice"]]
    # a node this build computed inside another node's kernel got no kernel of its own (graphbisect's unapplied)
    hosts = fused_hosts(compiled, nodes, producers)
    lost += [dict(c, used=f"{now[hosts[c['node']]][1]} (fused into {hosts[c['node']]})") for c in wanted
             if c["node"] not in now and hosts.get(c["node"]) in now]
    if lost:
        print(f"note: OpenVINO did not apply {len(lost)} pinned kernel choice(s): {lost[:5]}", file=sys.stderr)
    return compiled


def onnx_names(model_path):
    """The ONNX node names and each tensor's producer (empty without onnx: OpenVINO's names are used)."""
    try:
        import onnx
    except ImportError:
        return set(), {}
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return {n.name for n in graph.node}, {out: n.name for n in graph.node for out in n.output if out}


def onnx_node_of(name, nodes, producers):
    """The ONNX node an OpenVINO op name stands for (graphbisect's tactics.openvino.onnx_node_of)."""
    return mapping_of(name, nodes, producers)[0]


def mapping_of(name, nodes, producers):
    """(ONNX node, how many trailing ".N" were removed to find it): the name or a /-prefix of it, as a node or
    tensor name, then one ".N" less at a time (OpenVINO's ConvertPrecision names an int64 output's node "s.0"
    and its Convert back "s.0.0"; an f64 output's Convert back "s.0")."""
    if not nodes:
        return name, 0
    removed = 0
    while True:
        bare = name[: -len(SINK_SUFFIX)] if name.endswith(SINK_SUFFIX) else name
        parts = bare.split("/")
        for end in range(len(parts), 0, -1):
            prefix = "/".join(parts[:end])
            if prefix in nodes:
                return prefix, removed
            if prefix in producers:
                return producers[prefix], removed
        shorter = re.sub(OUTPUT_INDEX, "", name)
        if shorter == name or not shorter:
            return None, removed
        name, removed = shorter, removed + 1


def compiled_nodes(target, model_path, options):
    """What OpenVINO compiled the model into, as {"kind", "name"} per kernel of its execution graph."""
    return [{"kind": facts.get("layerType") or "?", "name": layer} for layer, facts, _ in kernels(target[0])]


def kernels(compiled):
    """(execution layer, its rt_info facts, its names: its own and its original layers') of each real kernel."""
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        facts = {key: info[key].astype(str) for key in info.keys()}
        primitive = facts.get("primitiveType") or ""
        if facts.get("layerType") in NOT_KERNELS or not primitive or primitive.startswith("unknown"):
            continue
        names = [op.get_friendly_name(), *(n for n in facts.get("originalLayersNames", "").split(",") if n)]
        yield op.get_friendly_name(), facts, names


def build_choices(compiled, nodes, producers):
    """ONNX node -> (execution layer, kernel without its precision suffix) of a compiled model."""
    choices, ranks = {}, {}
    for layer, facts, names in kernels(compiled):
        node, removed = next((m for m in (mapping_of(c, nodes, producers) for c in names) if m[0] is not None),
                             (None, 0))
        # one kernel per node: the fewest ".N" removed (the computing kernel, not the Convert back), then the first
        if node is not None and (node not in ranks or removed < ranks[node]):
            ranks[node] = removed
            choices[node] = (layer, re.sub(PRECISION_SUFFIX, "", facts["primitiveType"]), facts.get("layerType"))
    return choices


def fused_hosts(compiled, nodes, producers):
    """ONNX node -> the node whose kernel computed it, for nodes named only among a kernel's fused layers."""
    hosts = {}
    for _, _, names in kernels(compiled):
        mapped = [m for m in (onnx_node_of(n, nodes, producers) for n in names) if m is not None]
        for node in mapped[1:]:
            hosts.setdefault(node, mapped[0])
    return hosts


def ir_layers(model, nodes, producers):
    """IR layer -> (op type, the ONNX nodes it stands for: its own name and its fused names)."""
    layers = {}
    for op in model.get_ops():
        if op.get_type_name() in ("Parameter", "Result", "Constant"):
            continue
        info = op.get_rt_info()
        originals = {op.get_friendly_name()}
        if "fused_names_0" in info:
            originals.update(n for n in info["fused_names_0"].astype(str).split(",") if n)
        found = {n for n in (onnx_node_of(o, nodes, producers) for o in originals) if n is not None}
        old_type, old_nodes = layers.get(op.get_friendly_name(), (op.get_type_name(), frozenset()))
        layers[op.get_friendly_name()] = (old_type, frozenset(old_nodes | found))
    return layers


TYPE_ALIASES = {"fullyconnected": ("matmul",), "pooling": ("maxpool", "avgpool"), "softmax": ("softmax",)}


def same_kind(exec_type, ir_type):
    """Whether an execution layer type (Convolution) can be the IR op type (Convolution, GroupConvolution)."""
    if not exec_type:
        return False
    want, have = exec_type.lower(), ir_type.lower()
    return want in have or any(alias in have for alias in TYPE_ALIASES.get(want, ()))


def ir_pins(wanted, current, layers):
    """IR layer -> kernel for the record's choices that differ from the unpinned build, and the nodes no IR
    layer stands for (graphbisect's tactics.openvino.ir_pins)."""
    pins, unmapped = {}, []
    for choice in wanted:
        layer, have, layer_type = current.get(choice["node"], (None, None, None))
        if layer is None or have == choice["choice"]:
            continue
        if layer in layers:
            pins[layer] = choice["choice"]
            continue
        renamed = ir_name(layer, layers)
        if renamed is not None and choice["node"] in layers[renamed][1]:
            pins[renamed] = choice["choice"]  # execution layer "s.0" is the op "s" as read
            continue
        found = [name for name, (op_type, nodes) in layers.items()
                 if choice["node"] in nodes and same_kind(layer_type, op_type)]
        if not found:
            unmapped.append(choice["node"])
        for name in found:
            pins[name] = choice["choice"]
    return pins, unmapped


def ir_name(layer, layers):
    """The IR layer named like execution layer ``layer`` without its trailing ".N" suffixes, or None."""
    while (shorter := re.sub(OUTPUT_INDEX, "", layer)) != layer and shorter:
        if shorter in layers:
            return shorter
        layer = shorter
    return None


def pin_ir_xml(xml_in, xml_out, pins):
    """Copy an IR XML with <rt_info><attribute name="primitives_priority" value="cpu:KERNEL"/> in the pinned
    layers; returns the names of pinned layers it does not have."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(str(xml_in))
    found = set()
    for layer in tree.getroot().iter("layer"):
        name = layer.get("name") or ""
        if name not in pins:
            continue
        found.add(name)
        rt_info = layer.find("rt_info")
        if rt_info is None:
            rt_info = ET.SubElement(layer, "rt_info")
        for old in [a for a in rt_info.findall("attribute") if a.get("name") == "primitives_priority"]:
            rt_info.remove(old)
        value = pins[name] if pins[name].startswith("cpu:") else f"cpu:{pins[name]}"
        ET.SubElement(rt_info, "attribute", {"name": "primitives_priority", "version": "0", "value": value})
    tree.write(str(xml_out), encoding="utf-8", xml_declaration=True)
    return sorted(set(pins) - found)


def run_target(target, inputs, output_names):
    """Run once; outputs are found by index (compiled port names merge across fused nodes)."""
    compiled, names = target
    request = compiled.create_infer_request()
    feed = {}
    for port in compiled.inputs:
        name = next((n for n in sorted(port.get_names()) if n in inputs), None)
        if name is not None:
            feed[port] = np.asarray(inputs[name], order="C")  # keeps 0-d (ascontiguousarray makes it [1])
    request.infer(feed)
    return {name: np.array(request.get_output_tensor(names[name]).data, copy=True)
            for name in output_names if name in names}

'''


BACKEND = ReproBackend("openvino", "openvino (and onnx, for tactics.json)", "openvino", _openvino_options,
                       _OPENVINO_CODE, {"device": ANY, "precision": ANY, "threads": ANY, "config": OPENVINO_CONFIG,
                                        "tactics": BUNDLE_FILE})
