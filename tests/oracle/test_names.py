"""A crash's identity without the names a backend chose (issue 23): the same failure under other node and tensor
names, or in another process, normalizes alike; a different op or reason does not.

The messages are OpenVINO 2026.4.1's and ONNX Runtime 1.32's own, as their workers reported them; the tests at
the end make OpenVINO raise them for real.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.backends import BackendProcess, Phase, RunResult, RunStatus
from graphbisect.oracle.names import erase_names
from graphbisect.oracle.signature import (
    FailureKind,
    ModelNames,
    Signature,
    crash_names,
    names_in,
    normalize_message,
    signature_of,
)

_HEAD = ("Exception from src/inference/src/cpp/core.cpp:132:\nException from src/inference/src/dev/plugin.cpp:59:\n"
         "Check 'DimType::merge(merged_dimension, arg0_col_dim, arg1_row_dim) || arg0_col_dim.is_dynamic() || "
         "arg1_row_dim.is_dynamic()' failed at src/core/shape_inference/include/matmul_shape_inference.hpp:65:\n")
_REASON = ("Incompatible MatMul matrix dimension. First input dimension=16 at COL_INDEX_DIM=1 doesn't match the "
           "second input dimension=64 at ROW_INDEX_DIM=0\n\n\n")


def _matmul(node: str, reduce: str = "/blk5/pool/ReduceMean", weight: str = "blk5.pool.weight",
            reason: str = _REASON) -> str:
    """OpenVINO's MatMul validation error; ``node`` is how it names the MatMul (its own name, or its output's
    when that output is a graph output)."""
    return (f"{_HEAD}While validating node 'opset1::MatMul {node} (opset1::ReduceMean {reduce}[0]:f32[4,16], "
            f"opset1::Constant {weight}[0]:f32[64,64]) -> (f32[1,64])' with friendly_name '{node}':\n{reason}")


def _if(number: int, cond: str = "opset1::Greater /gt[0]", data: str = "opset1::Relu /relu[0]",
        output: str = "y", reason: str = "Rank of If condition input must be equal to 0 or 1") -> str:
    """OpenVINO's refusal of an If whose condition has shape [1, 1]; ``number`` is its per-process node number."""
    return ("Exception from src/inference/src/cpp/core.cpp:132:\nException from src/inference/src/dev/plugin.cpp:59:\n"
            "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
            "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted. Failed operations detailed "
            f"log:\n-- If-17 with a message:\nWhile validating ONNX node '<Node(If): {output}>': Check "
            "'if_condition_rank.compatible(1) || if_condition_rank.compatible(0)' failed at "
            "src/core/src/op/if.cpp:95:\n"
            f"While validating node 'opset8::If If_{number} ({cond}:boolean[1,1], {data}:f32[1,4]) -> ()' with "
            f"friendly_name 'If_{number}':\n{reason}\n\nSummary:\n-- Conversion is failed for: If-17\n\n\n")


def _crash(message: str, phase: Phase = Phase.LOAD, error_type: str = "RuntimeError") -> RunResult:
    return RunResult(RunStatus.CRASH, phase=phase, error_type=error_type, message=message)


# ----------------------------------------------------------------------------- the same failure, other names


def test_openvino_renaming_a_node_after_its_graph_output_is_the_same_failure() -> None:
    """Issue 23: without the trailing Reshape the MatMul's output is a graph output and OpenVINO names the node
    after it: the 3-node candidate was "a different failure" of the 4-node one."""
    host = ModelNames(_chain_model(tail=True))
    kept = _sig(_matmul("/blk5/pool/MatMul"), host)
    cut = _sig(_matmul("/blk5/pool/MatMul_output_0"), host)
    assert kept.matches(cut), (kept.detail, cut.detail)
    assert kept.detail == cut.detail
    assert "opset1::MatMul <name> (" in kept.detail and "friendly_name '<name>'" in kept.detail
    assert "Incompatible MatMul matrix dimension. First input dimension=16" in kept.detail  # the reason stays


def test_openvino_per_process_node_numbers_are_the_same_failure() -> None:
    """hey_jarvis: ``If_5381`` in one worker, ``If_5515`` in the next made the target look flaky."""
    assert _sig(_if(5381)).matches(_sig(_if(5515)))
    assert _sig(_if(46)).detail == _sig(_if(104)).detail
    assert "5381" not in _sig(_if(5381)).detail and "opset8::If <name> (" in _sig(_if(5381)).detail
    assert "If-17 with a message" in _sig(_if(5381)).detail  # the op and its opset stay


def test_an_input_cut_from_its_producer_is_the_same_failure() -> None:
    """A reduction feeds the If's condition as a Parameter (or freezes it as a Constant): OpenVINO then
    describes the input by that producer instead of the Greater the original computed it with."""
    original = _sig(_if(17, "opset1::Greater /blk/gate/Greater[0]", "opset1::MatMul /blk/MatMul[0]",
                        "/blk/gate/If_output_0"))
    alone = _sig(_if(3, "opset1::Constant /blk/gate/Greater_output_0[0]", "opset1::Parameter /blk/MatMul_output_0[0]",
                     "/blk/gate/If_output_0"))
    assert original.matches(alone), (original.detail, alone.detail)
    assert "(<name>[0]:boolean[1,1], <name>[0]:f32[1,4])" in original.detail  # types and shapes stay


def test_onnx_runtime_node_names_in_its_messages() -> None:
    run = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
           "Name:'{}' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 "
           "input_shape_size == requested_shape_size was false. The input tensor cannot be reshaped to the "
           "requested shape. Input shape:{{2,3}}, requested shape:{{4,4}}\n")
    assert _sig(run.format("/blk3/Reshape_1"), phase=Phase.RUN).matches(_sig(run.format("/blk9/view"), phase=Phase.RUN))
    load = "[ONNXRuntimeError] : 1 : FAIL : Node ({}) Op (MatMul) [ShapeInferenceError] Incompatible dimensions"
    assert _sig(load.format("/blk/MatMul")).detail == _sig(load.format("MatMul_17")).detail
    assert "Op (MatMul) [ShapeInferenceError] Incompatible dimensions" in _sig(load.format("x")).detail


def test_the_models_own_names_anywhere_in_a_message() -> None:
    """A tensor named in free text ("for input: x.1") is one of the model's: it goes, given the model's names."""
    message = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: {} for the following "
               "indices\n index: 1 Got: 4 Expected: 3\n Please fix either the inputs/outputs or the model.")
    names = crash_names(["x.1", "/embed/input_ids"])
    one, other = message.format("x.1"), message.format("/embed/input_ids")
    assert _sig(one, names, Phase.RUN).matches(_sig(other, names, Phase.RUN))
    assert not _sig(one, phase=Phase.RUN).matches(_sig(other, phase=Phase.RUN))
    assert names_in(message.format("/a/b/x.1"), names) == ["x.1"]


def test_the_same_failure_normalizes_alike_in_any_order_and_twice() -> None:
    names = ModelNames(_chain_model(tail=False))
    once = normalize_message(_if(5381), names)
    assert erase_names(once, names) == once  # idempotent: a re-read signature does not change again
    recorded = Signature(FailureKind.CRASH_LOAD, f"RuntimeError: {once}")
    assert recorded.without_names(names) == recorded


# ------------------------------------------------------------------------------- different failures stay apart


@pytest.mark.parametrize(("a", "b"), [
    # another op fails
    (_matmul("/blk/MatMul"), _matmul("/blk/MatMul").replace("opset1::MatMul", "opset1::Convolution")),
    # another reason: other dimensions
    (_matmul("m"), _matmul("m", reason=_REASON.replace("dimension=64", "dimension=32"))),
    # another reason: the same op refused for something else
    (_if(5381), _if(5381, reason="Incorrect If condition element type")),
    # another input type: the check that failed is about it
    (_if(17), _if(17).replace("boolean[1,1]", "boolean[1,1,1]")),
    # ONNX Runtime: the same words about another op
    ("Node (a) Op (MatMul) [ShapeInferenceError] Incompatible dimensions",
     "Node (a) Op (Gemm) [ShapeInferenceError] Incompatible dimensions"),
    # a quoted parameter is a word of the reason, not a name (onnxruntime's FuseReluClip)
    ("/src/relu_clip_fusion.cc:83 Unexpected data type for Clip 'min' input of 11",
     "/src/relu_clip_fusion.cc:83 Unexpected data type for Clip 'max' input of 11"),
])
def test_different_failures_stay_different(a: str, b: str) -> None:
    names = crash_names(["/blk/MatMul", "m", "a", "min", "max", "input", "MatMul", "y.1"])
    assert not _sig(a, names).matches(_sig(b, names)), _sig(a, names).detail


def test_plain_word_names_stay_in_the_reason() -> None:
    """A model with tensors called ``input`` and a node called ``MatMul`` (plain words): they are names only where
    the message's format says so; "First input dimension" and "Incompatible MatMul" keep their words."""
    names = crash_names(["input", "MatMul", "12", "x"])
    assert names == frozenset()
    detail = _sig(_matmul("MatMul", reduce="input"), names).detail
    assert "Incompatible MatMul matrix dimension. First input dimension=16 at COL_INDEX_DIM=1" in detail
    assert "opset1::MatMul <name> (<name>[0]:f32[4,16]" in detail


def test_other_stages_and_error_types_stay_different() -> None:
    # a crash's stage (the If's conversion failure is a refusal since issue 26: a refusal has none)
    assert not _sig(_matmul("m")).matches(_sig(_matmul("m"), phase=Phase.RUN))
    assert not _sig(_if(1)).matches(signature_of(_crash(_if(1), error_type="GeneralFailure"), None))


# ------------------------------------------------------------------------------------ recorded before this


def test_a_signature_recorded_before_names_were_erased_matches_todays() -> None:
    """Bundles and resumed work folders hold details with the names in (paths cut as they were): re-read, they
    are today's signature of the same failure."""
    names = ModelNames(_chain_model(tail=True))
    old = {"kind": "crash-load", "band": None,
           "detail": "RuntimeError: Exception from core.cpp: Exception from plugin.cpp: Check 'DimType::merge(merged_"
                     "dimension, arg0_col_dim, arg1_row_dim) || arg0_col_dim.is_dynamic() || arg1_row_dim.is_dynamic()'"
                     " failed at matmul_shape_inference.hpp: While validating node 'opset1::MatMul MatMul (opset1::"
                     "ReduceMean ReduceMean[0]:f32[4,16], opset1::Constant blk5.pool.weight[0]:f32[64,64]) -> "
                     "(f32[1,64])' with friendly_name 'MatMul': Incompatible MatMul matrix dimension. First input "
                     "dimension=16 at COL_INDEX_DIM=1 doesn't match the second input dimension=64 at ROW_INDEX_DIM=0"}
    now = _sig(_matmul("/blk5/pool/MatMul_output_0"), names)
    assert Signature.from_json(old, names=names) == now
    assert Signature.from_json(old).matches(now)  # no name of this one lies outside OpenVINO's node descriptions
    # what graphbisect recorded for the If of a host before (its per-process number and names in), and what a
    # candidate of it, the If alone, raises in a worker that compiled a few hundred models since
    numbered = {"kind": "crash-load", "band": None, "detail": (
        "RuntimeError: Exception from core.cpp: Check 'false' failed at unconverted_ops_report.cpp: FrontEnd API "
        "failed with OpConversionFailure: Model wasn't fully converted. Failed operations detailed log: -- If-17 "
        "with a message: While validating ONNX node '<Node(If): If_output_0>': Check 'if_condition_rank."
        "compatible(1) || if_condition_rank.compatible(0)' failed at if.cpp: While validating node 'opset8::If "
        "If_5669 (opset1::Greater Greater[0]:boolean[1,1], opset1::MatMul MatMul[0]:f32[1,4,16]) -> ()' with "
        "friendly_name 'If_5669': Rank of If condition input must be equal to 0 or 1")}
    candidate = (
        "Exception from src/inference/src/cpp/core.cpp:117:\nCheck 'false' failed at src/frontends/common_translators"
        "/src/unconverted_ops_report.cpp:151:\nFrontEnd API failed with OpConversionFailure:\nModel wasn't fully "
        "converted. Failed operations detailed log:\n-- If-17 with a message:\nWhile validating ONNX node "
        "'<Node(If): /blk13/gate/If_output_0>': Check 'if_condition_rank.compatible(1) || if_condition_rank."
        "compatible(0)' failed at src/core/src/op/if.cpp:95:\nWhile validating node 'opset8::If If_7001 (opset1::"
        "Constant /blk13/gate/Greater_output_0[0]:boolean[1,1], opset1::Parameter /blk13/MatMul_output_0[0]:"
        "f32[1,4,16]) -> ()' with friendly_name 'If_7001':\nRank of If condition input must be equal to 0 or 1\n\n"
        "Summary:\n-- Conversion is failed for: If-17\n")
    assert not Signature(FailureKind.CRASH_LOAD, numbered["detail"]).matches(_sig(candidate))  # as it was read
    assert Signature.from_json(numbered).matches(_sig(candidate))


def test_model_names_cover_subgraphs_and_skip_plain_words() -> None:
    model = _if_model()
    names = ModelNames(model)
    assert "then/Relu_output_0" not in names and "Relu_output_0" in names  # as a message shows them: paths cut
    assert "cond" not in names and "y" not in names  # plain words


# ------------------------------------------------------------------------------------------- real OpenVINO


@pytest.mark.openvino
def test_openvino_numbers_nodes_per_process_and_the_signature_does_not(tmp_path: Path) -> None:
    """The If model in a fresh worker, and in one that compiled other models first (as a reduction's workers
    do): OpenVINO's messages differ in the If's number, the signatures do not."""
    pytest.importorskip("openvino")
    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    feeds = {"a": np.ones((1, 4), np.float32), "cond": np.ones((1, 1), bool)}
    with BackendProcess("openvino", workdir=tmp_path / "fresh") as fresh:
        first = fresh.run(path, feeds)
    with BackendProcess("openvino", workdir=tmp_path / "busy") as busy:
        for _ in range(3):
            busy.run(path, feeds)
        later = busy.run(path, feeds)
    assert first.status is RunStatus.CRASH and later.status is RunStatus.CRASH, (first.describe(), later.describe())
    assert "Rank of If condition input must be equal to 0 or 1" in (first.message or "")
    numbers = [_if_number(run.message or "") for run in (first, later)]
    assert numbers[0] != numbers[1], numbers  # OpenVINO 2026.4.1 counts per process
    names = ModelNames(onnx.load(path))
    assert signature_of(first, None, names=names) == signature_of(later, None, names=names)


@pytest.mark.openvino
def test_openvino_renamed_output_gives_the_same_signature(tmp_path: Path) -> None:
    """The Reduce → Reshape → MatMul chain with and without its trailing Reshape, compiled by OpenVINO."""
    pytest.importorskip("openvino")
    runs = []
    with BackendProcess("openvino", workdir=tmp_path / "ov") as ov:
        for tail in (True, False):
            path = tmp_path / f"chain-{tail}.onnx"
            onnx.save(_chain_model(tail=tail), path)
            runs.append(ov.run(path, {"x": np.ones((1, 4, 16), np.float32)}))
    assert all(run.status is RunStatus.CRASH for run in runs), [run.describe() for run in runs]
    assert "with friendly_name 'm'" in (runs[1].message or "")  # renamed after the graph output
    names = ModelNames(_chain_model(tail=True))
    assert signature_of(runs[0], None, names=names) == signature_of(runs[1], None, names=names)


# --------------------------------------------------------------------------------------------------- helpers


def _sig(message: str, names: ModelNames | frozenset[str] = frozenset(), phase: Phase = Phase.LOAD) -> Signature:
    return signature_of(_crash(message, phase), None, names=names)


def _if_number(message: str) -> str:
    return message.split("opset8::If ", 1)[1].split(" ", 1)[0]


def _chain_model(*, tail: bool) -> onnx.ModelProto:
    """ReduceMean(keepdims=0) → Reshape → MatMul (→ Reshape), the chain OpenVINO 2026.4.1 fails to compile."""
    inits = [numpy_helper.from_array(np.array([1, 64], np.int64), "flat"),
             numpy_helper.from_array(np.ones((64, 64), np.float32), "blk5.pool.weight"),
             numpy_helper.from_array(np.array([1, 4, 16], np.int64), "back")]
    nodes = [helper.make_node("ReduceMean", ["x"], ["r"], name="/blk5/pool/ReduceMean", axes=[0], keepdims=0),
             helper.make_node("Reshape", ["r", "flat"], ["s"], name="/blk5/pool/Reshape"),
             helper.make_node("MatMul", ["s", "blk5.pool.weight"], ["m" if not tail else "/blk5/pool/MatMul_output_0"],
                              name="/blk5/pool/MatMul")]
    if tail:
        nodes.append(helper.make_node("Reshape", ["/blk5/pool/MatMul_output_0", "back"], ["m"], name="/blk5/pool/tail"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _if_model() -> onnx.ModelProto:
    """One If whose condition has shape [1, 1] (ONNX: one element; OpenVINO: rank 0 or 1 only)."""
    branches = {}
    for branch, op_type in (("then", "Relu"), ("else", "Neg")):
        out = f"{branch}/{op_type}_output_0"
        branches[f"{branch}_branch"] = helper.make_graph(
            [helper.make_node(op_type, ["a"], [out], name=f"{branch}/{op_type}")], branch, [],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], name="/blk/If", **branches)], "if",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
