"""The compiled-graph description: ONNX Runtime's optimized model, OpenVINO's execution graph, TensorRT's layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.examples.bundled import example_model_path
from graphbisect.localize.compiled import CompiledGraph, compiled_graph, from_engine_layers, from_exec_graph
from graphbisect.model import Model, load_model


def _conv_bn_relu() -> onnx.ModelProto:
    """conv → batch norm → relu → conv → relu: the CPU plugins fold BN into the conv and fuse the relus."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w1")]
    for name in ("scale", "bias", "mean"):
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), name))
    inits.append(numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var"))
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["y"], name="relu1"),
    ]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _optimized(model: Model, tmp_path: Path) -> Path:
    """Save ``model`` and have ONNX Runtime (``all``) write the optimized model it builds; return that one's path."""
    ort = pytest.importorskip("onnxruntime")
    model.save(tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "m.opt.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    return tmp_path / "m.opt.onnx"


def test_onnxruntime_optimized_model_maps_fusions_back(tmp_path: Path) -> None:
    """ORT (all, NCHWc on this CPU or not) compiles conv+bn+relu into one node: r0 survives, c0 and bn do not."""
    model = load_model(_conv_bn_relu())
    optimized = _optimized(model, tmp_path)
    graph = compiled_graph(model.nodes, model.output_names, {"optimized_model": str(optimized)})
    assert graph is not None
    first = graph.by_original()["conv0"]
    assert first.originals == ("conv0", "bn", "relu0") and first.outputs == ("r0",)
    assert graph.surviving == {"r0", "y"} and graph.region(model.nodes, 1) == {0, 1, 2}
    assert CompiledGraph.from_json(graph.to_json()) == graph


def test_openvino_execution_graph_is_mapped_to_onnx_nodes() -> None:
    """The CPU plugin's execution graph of the bundled example: fused layers and the nodes it forgets.

    OpenVINO fuses the keepdims=0 LayerNorm of block 10 into an MVN whose ``originalLayersNames`` names
    only the final Div; the nodes before it are attributed to the MVN (they feed nothing else).
    """
    ov = pytest.importorskip("openvino")
    from graphbisect.backends.openvino import _exec_graph

    model = load_model(example_model_path())
    compiled = ov.Core().compile_model(str(example_model_path()), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    layers = _exec_graph(compiled)
    mvn = next(layer for layer in layers if layer["name"] == "/blk10/norm/Div")
    assert mvn["layer_type"] == "MVN" and mvn["original_layers"] == ["/blk10/norm/Div"]
    graph = from_exec_graph(model.nodes, model.output_names, layers)
    node = graph.by_original()["/blk10/norm/Div"]
    assert node.kind == "MVN" and node.outputs == ("/blk10/norm/Div_output_0",)
    assert node.originals == tuple(f"/blk10/norm/{n}" for n in
                                   ("ReduceMean", "Sub", "Pow", "ReduceMean_1", "Add", "Sqrt", "Div"))
    assert "/blk10/norm/ReduceMean" in graph.inferred and "/blk10/norm/Div" not in graph.inferred
    assert "/blk10/norm/Sub_output_0" not in graph.surviving
    # the compiled node says which of its members were inferred, and keeps it through JSON
    assert node.inferred == node.originals[:-1]
    assert node.to_json()["inferred"] == list(node.originals[:-1])
    assert CompiledGraph.from_json(graph.to_json()).by_original()["/blk10/norm/Div"] == node
    assert "(membership of /blk10/norm/ReduceMean, " in node.describe()
    named = [n for n in graph.nodes if n.fused and not n.inferred]
    assert named and all("inferred" not in n.describe() for n in named)


def test_compiled_node_from_older_json_has_no_inferred_members() -> None:
    """A report written before ``inferred`` existed reads back as making no such claim."""
    from graphbisect.localize.compiled import CompiledNode

    old = {"name": "f", "kind": "Fused", "originals": ["a", "b"], "outputs": ["y"]}
    assert CompiledNode.from_json(old).inferred == ()


def test_a_compiled_node_with_its_model_precision_keeps_every_other_field() -> None:
    """with_model_precision spells out dataclasses.replace (thousands of nodes a compare): every field but the
    model's precision is the node's own, and a field added later fails here until it is carried too."""
    import dataclasses

    from graphbisect.localize.compiled import CompiledNode

    values = {"name": "fc", "kind": "FullyConnected", "originals": ("mm", "add"), "outputs": ("y",),
              "inferred": ("add",), "precision": ("i8",), "model_precision": ("f16",)}
    assert set(values) == {f.name for f in dataclasses.fields(CompiledNode)}
    node = CompiledNode(**values)  # type: ignore[arg-type]
    annotated = node.with_model_precision(("f32",))
    assert dataclasses.asdict(annotated) == {**values, "model_precision": ("f32",)}
    assert annotated.lower_precision == ("i8",)


def test_tensorrt_layers_from_inspector_metadata_or_names() -> None:
    """Engine inspector layers (detailed verbosity: ONNX names in Metadata; otherwise in the layer name)."""
    model = load_model(_conv_bn_relu())
    layers = [
        {"Name": "conv0 + bn + relu0", "LayerType": "CaskConvolution",
         "Metadata": "[ONNX Layer: conv0]\x1e[ONNX Layer: bn]\x1e[ONNX Layer: relu0]"},
        {"Name": "Reformatting CopyNode for Input Tensor 0 to conv1", "LayerType": "Reformat"},
        "conv1 + relu1",  # layer information at LayerInformationFormat.ONELINE / default verbosity
    ]
    graph = from_engine_layers(model.nodes, model.output_names, layers)
    assert [(n.originals, n.outputs) for n in graph.nodes] == [
        (("conv0", "bn", "relu0"), ("r0",)), (("conv1", "relu1"), ("y",))]
    assert graph.unmapped == ("Reformatting CopyNode for Input Tensor 0 to conv1",)
    assert compiled_graph(model.nodes, model.output_names, {"layers": layers}) == graph


def _residual_block(channels: int = 16) -> onnx.ModelProto:
    """conv → relu → conv (``c2``) → add the skip → relu (``s``) → conv: a ResNet block. On a CPU with NCHWc
    kernels ONNX Runtime (``all``) builds conv2 as an NCHWc Conv named ``c2_nchwc`` that then also takes the
    Add as its ``Sum`` input and the Relu as its ``activation``: it computes ``s``; ``c2`` exists nowhere."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), w)
             for w in ("w1", "w2", "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["s"], name="relu2"),
             helper.make_node("Conv", ["s", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1])]
    shape = [1, channels, 8, 8]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _nhwc_input(channels: int = 16) -> onnx.ModelProto:
    """An NHWC input transposed to NCHW (``t``) → conv → relu (``y``): a channels-last export (PP-OCR's SVTR
    blocks). ONNX Runtime (``all``, NCHWc kernels) folds the Transpose into a ``ReorderInput`` with
    ``channels_last=1``, whose output (``reorder_token_N``) is ``t`` blocked."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="to_nchw", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, channels])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])
    graph = helper.make_graph(nodes, "nhwc", [x], [y], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_transpose_folded_into_a_channels_last_reorder_is_mapped_and_compared(tmp_path: Path) -> None:
    """The ``ReorderInput`` (channels_last) stands for the Transpose it folded in: mapped to ``to_nchw``, its output
    ``t``; it was listed unmapped with a warning on every compare of PP-OCRv4 rec. The probe exposes ``t`` and its
    values, taken from ONNX Runtime, match the oracle's."""
    from graphbisect.workflows.compare import compare_models

    model = load_model(_nhwc_input())
    path = _optimized(model, tmp_path)
    optimized = onnx.load(str(path), load_external_data=False)
    folded = [n.name for n in optimized.graph.node
              if n.op_type == "ReorderInput" and any(a.name == "channels_last" and a.i for a in n.attribute)]
    if not folded:
        pytest.skip("ONNX Runtime folded no Transpose into a channels_last ReorderInput on this CPU")
    graph = compiled_graph(model.nodes, model.output_names, {"optimized_model": str(path)})
    assert graph is not None and folded[0] not in graph.unmapped
    reorder = graph.by_original()["to_nchw"]
    assert reorder.name == folded[0] and reorder.kind == "ReorderInput"
    assert reorder.originals == ("to_nchw",) and reorder.outputs == ("t",)
    assert "t" in graph.surviving
    result = compare_models(model, workdir=tmp_path / "c")
    assert result.passed and result.layerwise is not None
    row = next(row for row in result.layerwise.rows if row.tensor == "t")
    assert row.compared and row.stats.passed and row.stats.max_abs == 0.0


def _fused_sums(path: Path, tmp_path: Path) -> int:
    """How many NCHWc Convs ONNX Runtime (``all``) builds with a fused ``Sum`` input for the model at ``path``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"{path.stem}.opt.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return sum(1 for n in optimized.graph.node if n.op_type == "Conv" and len(n.input) > 3 and n.input[3])


def test_an_nchwc_conv_that_fused_the_later_add_and_relu_computes_their_output(tmp_path: Path) -> None:
    """``c2_nchwc`` is named after ``c2`` but computes ``Relu(c2 + r1)``: the Add and Relu are compiled with
    conv2, ``s`` survives and ``c2`` does not, so the probe exposes ``s`` and ONNX Runtime still fuses the Add."""
    pytest.importorskip("onnxruntime")
    from graphbisect.workflows.compare import compare_models

    model = load_model(_residual_block())
    model.save(tmp_path / "m.onnx")
    if not _fused_sums(tmp_path / "m.onnx", tmp_path):
        pytest.skip("this CPU has no NCHWc kernels: ONNX Runtime keeps the NCHW layout")
    graph = compiled_graph(model.nodes, model.output_names, {"optimized_model": str(tmp_path / "m.opt.onnx")})
    assert graph is not None
    block = graph.by_original()["conv2"]
    assert block.name == "c2_nchwc" and block.originals == ("conv2", "add", "relu2") and block.outputs == ("s",)
    assert graph.by_original()["relu2"] is block and graph.by_original()["conv1"].originals == ("conv1", "relu1")
    assert graph.surviving == {"r1", "s", "y"}
    # The probe model (the surviving tensors exposed) is built as the plain model was: the Add stays fused.
    onnx.save(model.with_outputs(sorted(graph.surviving - {"y"})), str(tmp_path / "probe.onnx"))
    assert _fused_sums(tmp_path / "probe.onnx", tmp_path) == 1
    result = compare_models(model)
    assert result.passed and result.layerwise is not None and result.layerwise.first_divergence is None
    assert {row.tensor for row in result.layerwise.rows if row.compared} == {"r1", "s", "y"}
    rows = {row.tensor: row for row in result.layerwise.rows}
    assert rows["s"].compiled_as == block and not result.probe_masking


def _blocked_net(channels: int = 16) -> onnx.ModelProto:
    """conv → relu (``r0``) → max pool (``p``) → batch norm (``b``) → two relu(conv) branches sharing their weights
    (``ra``, ``rb``) → concat (``k``) → conv (``y``). On a CPU with NCHWc kernels ONNX Runtime (``all``) keeps
    every tensor blocked: the batch norm becomes a depthwise Conv named ``b_bn_nchwc``, the Concat keeps its name
    and op on blocked inputs, and the two equal branches are merged into one Conv (common subexpressions)."""
    rng = np.random.default_rng(0)
    c = channels
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
             for name, shape in (("w0", (c, c, 3, 3)), ("wa", (c, c, 1, 1)), ("wc", (c, 2 * c, 3, 3)))]
    for name in ("scale", "bias", "mean"):
        inits.append(numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), name))
    inits.append(numpy_helper.from_array(rng.random(c).astype(np.float32) + 0.5, "var"))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("MaxPool", ["r0"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["p", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Conv", ["b", "wa"], ["ca"], name="conv_a"),
             helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["b", "wa"], ["cb"], name="conv_b"),
             helper.make_node("Relu", ["cb"], ["rb"], name="relu_b"),
             helper.make_node("Concat", ["ra", "rb"], ["k"], name="cat", axis=1),
             helper.make_node("Conv", ["k", "wc"], ["y"], name="conv_c", pads=[1, 1, 1, 1])]
    shape = [1, c, 8, 8]
    graph = helper.make_graph(nodes, "blocked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_nchwc_node_maps_to_the_tensor_it_computes(tmp_path: Path) -> None:
    """ONNX Runtime's NCHWc nodes that are not named ``<tensor>_nchwc`` after what they compute are mapped from
    what they compute: the batch norm rewritten as ``b_bn_nchwc``, the kept ``Concat``, the Conv that stands for
    two merged branches. Each mapped blocked tensor holds, value for value, the original tensor it is mapped to;
    only the layout reorders map to no node."""
    ort = pytest.importorskip("onnxruntime")
    from graphbisect.workflows.probe import compiled_of

    model = load_model(_blocked_net())
    model.save(tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    if not any(n.domain == "com.microsoft.nchwc" for n in optimized.graph.node):
        pytest.skip("this CPU has no NCHWc kernels: ONNX Runtime keeps the NCHW layout")
    kinds = {n.name: n.op_type for n in optimized.graph.node}
    assert "b_bn_nchwc" in kinds and kinds.get("cat") == "Concat"  # the namings this test is about
    graph = compiled_of(model, {"optimized_model": str(tmp_path / "opt.onnx")})
    assert graph is not None
    assert sorted(kinds[name] for name in graph.unmapped) == ["ReorderInput", "ReorderOutput"]
    by_original = graph.by_original()
    assert by_original["bn"].name == "b_bn_nchwc" and by_original["bn"].outputs == ("b",)
    assert by_original["cat"].kind == "Concat" and by_original["cat"].outputs == ("k",)
    assert by_original["cat"].originals == ("cat",)  # the merged branch is not computed by the Concat
    branch = next(node for node in graph.nodes if node.outputs in {("ra",), ("rb",)})
    assert len([n for n in optimized.graph.node if n.op_type == "Conv"]) == 4  # the two branches are one Conv
    assert graph.surviving == {"r0", "p", "b", *branch.outputs, "k", "y"}
    # By value: expose each blocked tensor of the optimized model, unblock it, compare with the original tensor.
    produced = {n.name: n.output[0] for n in optimized.graph.node}
    blocked = {produced[c.name]: c.outputs[0] for c in graph.nodes}
    assert len(blocked) == 6 and all(name.startswith("reorder") for name in blocked)
    optimized.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in blocked)
    onnx.save(optimized, str(tmp_path / "replay.onnx"))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "replay.onnx"), options).run(list(blocked), {"x": x})
    onnx.save(model.with_outputs(list(blocked.values())), str(tmp_path / "probe.onnx"))
    want = ort.InferenceSession(str(tmp_path / "probe.onnx"), options).run(list(blocked.values()), {"x": x})

    def unblocked(value: np.ndarray, block: int) -> np.ndarray:
        n, c, h, w = value.shape
        return value.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3).reshape(n, c, h, w)

    assert any(all(np.allclose(unblocked(g, block)[:, :w.shape[1]], w, rtol=1e-4, atol=1e-4)
                   for g, w in zip(got, want, strict=True)) for block in (8, 16))  # MLAS's block: AVX2 8, AVX-512 16


def test_a_kept_node_is_matched_by_its_inputs_constants_included() -> None:
    """A renamed optimized ``Add`` is the original ``Add`` only when its inputs are the original's: an initializer
    the optimizer made may stand for a constant, never for a computed tensor (a wrong match would be a false
    divergence), and an initializer that keeps its name is that initializer."""
    from graphbisect.localize.optimized import optimized_tensors

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Neg", ["x"], ["n"], name="neg"),
             helper.make_node("Add", ["r", "n"], ["computed"], name="add_computed"),
             helper.make_node("Add", ["r", "c"], ["constant"], name="add_constant")]
    constants = {"c": numpy_helper.from_array(np.ones(4, np.float32), "c")}

    def optimized(second: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                                  helper.make_node("Add", ["r", second], ["renamed"], name="any")], "opt",
                                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], [],
                                 [numpy_helper.from_array(np.ones(4, np.float32), second)])

    assert optimized_tensors(nodes, optimized("folded_1"), constants).named[1][2] == ("constant",)
    assert optimized_tensors(nodes, optimized("c"), constants).named[1][2] == ("constant",)
    # Only the Add of a computed tensor reads r: the folded initializer cannot be its second input.
    assert optimized_tensors(nodes[:3], optimized("folded_1"), constants).named[1][2] == ()


def test_the_original_graph_made_ahead_maps_an_optimized_model_as_made_on_the_spot(tmp_path: Path) -> None:
    """`compare` makes what the mapping needs of the original model while the target builds (OriginalGraph, once
    per model); the mapping is the same as one that makes it when the optimized model is there."""
    ort = pytest.importorskip("onnxruntime")
    from graphbisect.localize.optimized import OriginalGraph, optimized_tensors
    from graphbisect.workflows.probe import original_graph

    for proto in (_blocked_net(), onnx.load(example_model_path())):
        model = load_model(proto)
        model.save(tmp_path / "m.onnx")
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "opt.onnx")
        ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(tmp_path / "opt.onnx")).graph
        constants = {t.name: t for t in model.proto.graph.initializer}
        ahead = original_graph(model)
        assert original_graph(model) is ahead  # made once per model
        assert isinstance(ahead, OriginalGraph)
        on_the_spot = optimized_tensors(model.nodes, optimized, constants)
        assert optimized_tensors(model.nodes, optimized, constants, original=ahead) == on_the_spot
        assert on_the_spot.named and on_the_spot.held


# --- what the backend really computed in (issue 26, item 1) ---------------------------------------------------
def _int8_weights() -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    from graphbisect.examples.quantized import int8_weight_model

    model, _ = int8_weight_model()
    return model, list(model.graph.node)


def _fc_layer(precision: str) -> list[dict[str, object]]:
    """OpenVINO 2026.4's execution graph of the int8-weight MatMul (the same with any group size)."""
    return [{"name": "x", "layer_type": "Input", "runtime_precision": "f32", "original_layers": ["x"]},
            {"name": "Transpose_5307", "layer_type": "Transpose", "runtime_precision": "i8", "original_layers": []},
            {"name": "y", "layer_type": "FullyConnected", "runtime_precision": precision,
             "output_precisions": "f32", "original_layers": ["y"]},
            {"name": "y/sink_port_0", "layer_type": "Output", "runtime_precision": "f32", "original_layers": []}]


def test_openvino_runtime_precision_is_compared_with_the_models() -> None:
    from graphbisect.localize.layerwise import constant_tensors

    _, nodes = _int8_weights()
    types = {"x": "f32", "w": "f32", "w_q": "i8", "w_scale": "f32", "y": "f32"}
    folded = constant_tensors(nodes, given={"w_q", "w_scale"})
    quantized = from_exec_graph(nodes, ["y"], _fc_layer("i8"), dynamic_quantization=32).with_model(
        nodes, types.get, folded)
    (fc,) = quantized.nodes
    assert (fc.kind, fc.originals, fc.precision) == ("FullyConnected", ("dq_w", "matmul"), ("i8",))
    assert fc.model_precision == ("f32",)  # the weights' DequantizeLinear is folded: not what the node computes
    assert fc.lower_precision == ("i8",) and quantized.lower_precision == (fc,)
    assert "ran in i8 where the model computes f32" in fc.describe() and "ran in i8" in quantized.summary()
    again = CompiledGraph.from_json(quantized.to_json())
    assert again == quantized and again.nodes[0].model_precision == ("f32",)
    # The same execution graph with dynamic quantization off: i8 weights, decompressed, computed in f32.
    (plain,) = from_exec_graph(nodes, ["y"], _fc_layer("i8"), dynamic_quantization=0).with_model(
        nodes, types.get, folded).nodes
    assert plain.precision == ("f32",) and not plain.lower_precision and not plain.precision_note()


@pytest.mark.parametrize(("ran", "model", "lower"), [
    (("i8",), ("f32",), ("i8",)),
    (("f16",), ("f32", "i64"), ("f16",)),
    (("bf16", "f32"), ("f32",), ("bf16",)),
    (("i8", "f32"), ("i8", "f32"), ()),  # a QDQ Conv: the model reads i8 there too
    (("u8", "f32"), ("i8", "f32"), ()),  # OpenVINO's u8 Convolution of it: the same width
    (("i8",), ("f32", "i16"), ("i8",)),  # an A16W8 head computed with i8 activations
    (("i32",), ("f32",), ()),  # index arithmetic, never quantized compute
    (("f32",), ("f64",), ("f32",)),  # IREE demotes f64
    (("i8",), ("i8", "i64"), ()),  # an integer model
    ((), ("f32",), ()),  # the backend did not say
])
def test_lower_precision(ran: tuple[str, ...], model: tuple[str, ...], lower: tuple[str, ...]) -> None:
    from graphbisect.localize.runtime_precision import lower_precision

    assert lower_precision(ran, model) == lower


def test_onnxruntime_matmulnbits_computes_in_i8(tmp_path: Path) -> None:
    """ONNX Runtime (all) rewrites DequantizeLinear(int8) → MatMul into MatMulNBits with accuracy_level 4: its
    activations are quantized to i8 too, which its optimized model shows."""
    from graphbisect.localize.layerwise import constant_tensors
    from graphbisect.workflows.probe import element_types

    ort = pytest.importorskip("onnxruntime")
    model, _ = _int8_weights()
    loaded = load_model(model)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(loaded.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    graph = compiled_graph(loaded.nodes, loaded.output_names, {"optimized_model": str(tmp_path / "optimized.onnx")})
    assert graph is not None
    (node,) = graph.nodes
    assert (node.kind, node.precision) == ("MatMulNBits", ("i8",))
    (node,) = graph.with_model(loaded.nodes, element_types(loaded),
                               constant_tensors(loaded.nodes, given=loaded.initializer_names)).nodes
    assert node.lower_precision == ("i8",)


def _yolo_silu_net() -> onnx.ModelProto:
    """A YOLOv8-style stand-in (NudeNet's detector): Conv → SiLU written as ``Mul(c, Sigmoid(c))`` everywhere, C2f
    blocks (1×1 conv, Split, bottleneck with a residual Add, Concat), SPPF (three MaxPools, Concat), a nearest
    Resize and a head Conv, with channel counts a multiple of 8. ONNX Runtime (``all``, a CPU with NCHWc kernels)
    fuses each SiLU into a ``com.microsoft`` QuickGelu, runs it on blocked tensors and renames its output
    ``reorder_token_N``; its name, ``<Mul's name>/QuickGeluFusion/``, is the only hint of what it computes."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def node(op: str, inputs: list[str], name: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [f"{name}_output_0"], name=name, **attrs))
        return f"{name}_output_0"

    def conv_silu(x: str, cin: int, cout: int, k: int, stride: int, *, at: str) -> str:
        w = rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)
        inits.extend([numpy_helper.from_array(w.astype(np.float32), f"{at}.w"),
                      numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{at}.b")])
        c = node("Conv", [x, f"{at}.w", f"{at}.b"], f"{at}/conv/Conv", kernel_shape=[k, k], strides=[stride] * 2,
                 pads=[k // 2] * 4)
        return node("Mul", [c, node("Sigmoid", [c], f"{at}/act/Sigmoid")], f"{at}/act/Mul")

    def c2f(x: str, c: int, at: str) -> str:
        y = conv_silu(x, c, c, 1, 1, at=f"{at}/cv1")
        inits.append(numpy_helper.from_array(np.array([c // 2, c // 2], np.int64), f"{at}.split"))
        a, b = f"{at}/Split_output_0", f"{at}/Split_output_1"
        nodes.append(helper.make_node("Split", [y, f"{at}.split"], [a, b], name=f"{at}/Split", axis=1))
        h = conv_silu(conv_silu(b, c // 2, c // 2, 3, 1, at=f"{at}/m.0/cv1"), c // 2, c // 2, 3, 1, at=f"{at}/m.0/cv2")
        cat = node("Concat", [a, b, node("Add", [b, h], f"{at}/m.0/Add")], f"{at}/Concat", axis=1)
        return conv_silu(cat, c * 3 // 2, c, 1, 1, at=f"{at}/cv2")

    x = conv_silu(conv_silu("images", 3, 16, 3, 2, at="/model.0"), 16, 32, 3, 2, at="/model.1")
    p2 = c2f(x, 32, "/model.2")
    x = c2f(conv_silu(p2, 32, 64, 3, 2, at="/model.3"), 64, "/model.4")
    y = conv_silu(x, 64, 32, 1, 1, at="/model.9/cv1")
    pools = [y]
    for k in ("m", "m_1", "m_2"):
        pools.append(node("MaxPool", [pools[-1]], f"/model.9/{k}/MaxPool", kernel_shape=[5, 5], pads=[2] * 4))
    y = conv_silu(node("Concat", pools, "/model.9/Concat", axis=1), 128, 64, 1, 1, at="/model.9/cv2")
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    up = node("Resize", [y, "", "scales"], "/model.10/Resize", mode="nearest")
    y = c2f(node("Concat", [up, p2], "/model.11/Concat", axis=1), 96, "/model.12")
    inits.append(numpy_helper.from_array((rng.standard_normal((8, 96, 1, 1)) * 0.1).astype(np.float32), "head.w"))
    out = node("Conv", [y, "head.w"], "/model.22/Conv")
    graph = helper.make_graph(nodes, "yolo_silu", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                                 [1, 3, 64, 64])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_yolo_silu_quickgelu_on_blocked_tensors_covers_its_sigmoid_and_mul(tmp_path: Path) -> None:
    """Issue 26 item 5 (NudeNet YOLOv8n on ONNX Runtime, ``all``): each QuickGelu the fusion made of a SiLU and
    the NCHWc transformer renamed computes its Mul's output. Unmapped, the next surviving tensor's node swallowed
    it and its Conv ("QuickGelu ← 8 nodes" with Convs; "QuickGelu+Conv ×38"). Every QuickGelu covers its Sigmoid
    and Mul, every Conv is its own compiled node, only layout reorders map to nothing, each blocked tensor holds
    its original's values, and the summary counts the saved model's nodes and fusions."""
    ort = pytest.importorskip("onnxruntime")
    from graphbisect.workflows.probe import compiled_of

    model = load_model(_yolo_silu_net())
    model.save(tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    kinds = {n.name: n.op_type for n in optimized.graph.node}
    gelus = [n for n in optimized.graph.node if n.op_type == "QuickGelu"]
    if not any(n.domain == "com.microsoft.nchwc" for n in optimized.graph.node) or len(gelus) != 17:
        pytest.skip("this CPU/ONNX Runtime does not build NCHWc QuickGelus of the SiLUs")
    assert all(n.output[0].startswith("reorder_token_") for n in gelus)  # the renaming this test is about
    graph = compiled_of(model, {"optimized_model": str(tmp_path / "opt.onnx")})
    assert graph is not None
    assert sorted(set(kinds[name] for name in graph.unmapped)) == ["ReorderInput", "ReorderOutput"]
    assert len(graph.nodes) + len(graph.unmapped) == len(optimized.graph.node)
    for compiled in graph.nodes:
        if compiled.kind == "QuickGelu":
            at = compiled.name.removesuffix("/Mul/QuickGeluFusion/")
            assert compiled.originals == (f"{at}/Sigmoid", f"{at}/Mul"), compiled
            assert compiled.outputs == (f"{at}/Mul_output_0",)
        else:
            assert not compiled.fused, compiled
    by_original = graph.by_original()
    assert len(by_original) == len(model.nodes)  # every original node is compiled somewhere
    assert all(by_original[n.name].kind == "Conv" for n in model.nodes if n.op_type == "Conv")
    assert graph.summary().startswith(f"optimized model: {len(optimized.graph.node)} compiled nodes, 17 of them fused "
                                      "(covering 34 original nodes)")
    # By value: each QuickGelu's blocked output is its Mul's output.
    mapped = {n.output[0]: graph.by_original()[f"{n.name.removesuffix('/QuickGeluFusion/')}"].outputs[0]
              for n in gelus}
    optimized.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in mapped)
    onnx.save(optimized, str(tmp_path / "replay.onnx"))
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "replay.onnx"), plain).run(list(mapped), {"images": x})
    onnx.save(model.with_outputs(list(mapped.values())), str(tmp_path / "probe.onnx"))
    want = ort.InferenceSession(str(tmp_path / "probe.onnx"), plain).run(list(mapped.values()), {"images": x})

    def unblocked(value: np.ndarray, block: int) -> np.ndarray:
        n, c, h, w = value.shape
        return value.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3).reshape(n, c, h, w)

    assert any(all(g.shape[1] % block == 0 and np.allclose(unblocked(g, block)[:, :w.shape[1]], w, rtol=1e-4,
                                                            atol=1e-4)
                   for g, w in zip(got, want, strict=True)) for block in (8, 16))



def _dynamically_quantized_conv(tmp_path: Path) -> Path:
    """A ViT's patch embedding (16×16 Conv, stride 16) through ONNX Runtime's ``quantize_dynamic``:
    DynamicQuantizeLinear → ConvInteger → Cast → Mul by ``Mul(activation scale, weight scale)``, the
    ``*_quant_scales_mul`` node the quantizer inserts, which ONNX Runtime (``all``) keeps as a Mul."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 16, 16)) * 0.02).astype(np.float32), "patch_w")
    conv = helper.make_node("Conv", ["pixel_values", "patch_w"], ["patch"], name="patch_conv",
                            kernel_shape=[16, 16], strides=[16, 16])
    graph = helper.make_graph([conv], "patch", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                                                              [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("patch", TensorProto.FLOAT, [1, 8, 2, 2])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              tmp_path / "float.onnx")
    quantization.quantize_dynamic(tmp_path / "float.onnx", tmp_path / "quantized.onnx")
    return tmp_path / "quantized.onnx"


def test_a_mul_of_dynamic_quantization_scales_ran_in_f32(tmp_path: Path) -> None:
    """DynamicQuantizeLinear's outputs are u8, f32 and u8: the Mul of its scale by the weights' scale computes
    in f32, and its row must not say "ran in u8" (an ONNX Runtime ``quantize_dynamic`` ViT did, on any CPU)."""
    from graphbisect.artifacts.compare_text import ran_in_cell
    from graphbisect.localize.layerwise import constant_tensors
    from graphbisect.workflows.probe import element_types

    ort = pytest.importorskip("onnxruntime")
    loaded = load_model(onnx.load(_dynamically_quantized_conv(tmp_path)))
    (scales,) = [n.name for n in loaded.nodes if n.op_type == "Mul" and n.name.endswith("_quant_scales_mul")]
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(loaded.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    graph = compiled_graph(loaded.nodes, loaded.output_names, {"optimized_model": str(tmp_path / "optimized.onnx")})
    assert graph is not None
    graph = graph.with_model(loaded.nodes, element_types(loaded),
                             constant_tensors(loaded.nodes, given=loaded.initializer_names))
    mul = graph.by_original()[scales]
    assert (mul.kind, mul.precision, mul.model_precision) == ("Mul", ("f32",), ("f32",)), mul
    assert ran_in_cell(mul) == "f32" and not mul.precision_note()
    conv = next(n for n in graph.nodes if n.kind == "ConvInteger")
    assert conv.precision == ("u8", "i8")  # the integer kernel itself says so
    assert not graph.lower_precision and "ran in" not in graph.summary(), graph.summary()


def test_float_outputs_of_quantized_kernels_are_typed_float() -> None:
    """What reads DynamicQuantizeLinear's scale or MatMulIntegerToFloat's output computes in f32, where the optimized
    model declares no type for them (ONNX Runtime's saved models often do not)."""
    from graphbisect.localize.runtime_precision import optimized_precisions

    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
             helper.make_node("Mul", ["s", "w_scale"], ["scales"], name="scales_mul"),
             helper.make_node("MatMulIntegerToFloat", ["q", "w", "scales", "one", "z"], ["mm"], name="mm",
                              domain="com.microsoft"),
             helper.make_node("Relu", ["mm"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])], [],
                              [numpy_helper.from_array(np.ones((4, 3), np.int8), "w"),
                               numpy_helper.from_array(np.array(0.5, np.float32), "w_scale"),
                               numpy_helper.from_array(np.array(1, np.float32), "one")])
    assert optimized_precisions(graph) == {"dql": ("f32",), "scales_mul": ("f32",), "mm": ("u8", "i8"),
                                           "relu": ("f32",)}


def test_a_compiled_nodes_model_precision_is_that_of_its_originals_together() -> None:
    """``with_model`` reads what each original node computes in alone, made once per model: a group's is their
    union in its originals' order, as walking the group's inputs gives it, constants' nodes left out."""
    from graphbisect.localize.compiled import CompiledNode
    from graphbisect.localize.runtime_precision import model_precision

    nodes = [helper.make_node("Constant", [], ["k"], name="const", value=numpy_helper.from_array(np.ones(1, np.int8))),
             helper.make_node("DequantizeLinear", ["k", "s"], ["w"], name="dq"),
             helper.make_node("Cast", ["x"], ["c"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["c", "w"], ["a"], name="add"),
             helper.make_node("Gather", ["a", "i"], ["y"], name="gather")]
    types = {"k": "i8", "s": "f32", "w": "f32", "x": "f16", "c": "f32", "a": "f32", "i": "i64", "y": "f32"}
    constants = {"k", "w"}
    groups = [("gather", "add"), ("cast", "add", "gather"), ("dq", "add"), ("const",), ("add", "cast")]
    graph = CompiledGraph("optimized model", tuple(CompiledNode(f"g{i}", "Fused", group, (), precision=("f32",))
                                                   for i, group in enumerate(groups)))
    by_name = {node.name: node for node in nodes}
    annotated = graph.with_model(nodes, types.get, constants)
    for group, node in zip(groups, annotated.nodes, strict=True):
        assert node.model_precision == model_precision([by_name[o] for o in group], types.get, constants), group
    assert [node.model_precision for node in annotated.nodes] == [
        ("f32", "i64"), ("f16", "f32", "i64"), ("f32",), (), ("f32", "f16")]
