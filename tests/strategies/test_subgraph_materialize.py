"""Candidates assembled from serialized pieces are exactly the models the documented rules describe.

``SubgraphSpace.materialize`` joins bytes serialized once per space (nodes, declarations, initializer stubs)
instead of building a ``ModelProto`` per candidate, and ``SubgraphSpace.check`` asks ``onnx.checker`` only
about the pieces a candidate adds. These tests hold both to a slow reference on real models (PP-OCR, Magika,
Silero VAD, a host network): the reference builds each candidate as a ``ModelProto`` from the rules in the
module docstring, field by field, and the candidate's bytes must equal its serialization; the checker's
verdict on the saved file must equal ``check`` on every candidate, including those it refuses.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.data import ActivationStore, random_inputs
from graphbisect.data.protos import tensor_from_array
from graphbisect.data.store import StoredFeeds
from graphbisect.examples import host_network
from graphbisect.model import Model, load_model
from graphbisect.model.io import strip_to_external
from graphbisect.model.normalize import node_dependencies
from graphbisect.oracle.tester import model_digest
from graphbisect.strategies.subgraph import SubgraphSpace, check_file
from tests.declaration_models import bilstm_inputs, bilstm_tagger
from tests.real_models import magika, rapidocr_model, silero_vad

# ------------------------------------------------------------------------------------------- the reference


def _reference(space: SubgraphSpace, keep: frozenset[int]) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """(model, feeds, outputs) of ``keep`` built field by field from the module docstring's rules."""
    model = space.model
    order = sorted(keep)
    read: dict[str, None] = {}
    produced: set[str] = set()
    for index in order:
        read.update(dict.fromkeys(node_dependencies(model.nodes[index])))
        produced.update(name for name in model.nodes[index].output if name)
    graph_inputs = [v.name for v in model.proto.graph.input]
    initializers = [t.name for t in model.proto.graph.initializer]
    outside = [name for name in read if name not in produced]
    # the original's inputs first, in its order; initializers in its order
    cut = [name for name in graph_inputs if name in outside and name not in initializers]
    cut += [name for name in outside if name not in initializers and name not in cut]
    inits = [name for name in initializers if name in outside]
    # original outputs in its order, then the frontier: no kept node reads it, some node of the original does
    outputs = [name for name in model.output_names if name in produced]
    outputs += [name for index in order for name in model.nodes[index].output
                if name and name not in read and name not in model.output_names and name in model.consumers]
    stubs = {t.name: t for t in strip_to_external(model.proto, space.refs).graph.initializer}
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    graph = proto.graph
    for name in ("node", "initializer", "input", "output", "value_info"):
        graph.ClearField(name)
    graph.node.extend(model.nodes[i] for i in order)
    graph.initializer.extend(stubs[name] for name in inits)
    feeds, fed, constants = [], [], []
    for name in cut:
        value = space.values(name)
        small_int = isinstance(value, np.ndarray) and value.dtype.kind in "biu" and value.size <= 4096
        if small_int and name not in model.input_names and not _dynamic(model, name):
            constants.append(tensor_from_array(value, name))
        else:
            fed.append(_declaration(model, name, value))
            feeds.append(name)
    graph.initializer.extend(constants)
    # graph inputs: the original's own (fed inputs, initializers it lists as inputs) in its order, then cut points
    own = {v.name: v for v in fed if v.name in graph_inputs}
    own.update((v.name, v) for v in model.proto.graph.input if v.name in initializers and v.name in inits)
    graph.input.extend(own[name] for name in graph_inputs if name in own)
    graph.input.extend(v for v in fed if v.name not in own)
    graph.output.extend(_output(model, name, space.values) for name in outputs)
    graph.value_info.extend(v for v in model.proto.graph.value_info if v.name in produced and v.name not in outputs)
    return proto, feeds, outputs


def _declaration(model: Model, name: str, value: Any) -> onnx.ValueInfoProto:
    known = model.boundary_type(name)
    if known is not None and isinstance(value, np.ndarray) and known.type.HasField("tensor_type"):
        tensor = known.type.tensor_type
        dims = tensor.shape.dim
        if tensor.elem_type == helper.np_dtype_to_tensor_dtype(value.dtype) and (
                not tensor.HasField("shape") or (len(dims) == value.ndim and all(
                    not d.HasField("dim_value") or d.dim_value in (n, -1)  # -1: a converter's dynamic dim
                    for d, n in zip(dims, value.shape, strict=True)))):
            # a declaration without a shape gets the value's rank (the original's own graph inputs aside)
            return known if name in model.input_names else _ranked(known, value.ndim)
    # nothing usable declared: the value's element type and rank, every dimension unknown
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), [None] * value.ndim)


def _ranked(known: onnx.ValueInfoProto, rank: int) -> onnx.ValueInfoProto:
    """``known``, or where it is a tensor type without a shape, a copy with ``rank`` unknown dimensions."""
    if not known.type.HasField("tensor_type") or known.type.tensor_type.HasField("shape"):
        return known
    tensor = known.type.tensor_type
    return helper.make_tensor_value_info(known.name, tensor.elem_type, [None] * rank)


def _dynamic(model: Model, name: str) -> bool:
    """Whether the original gives ``name`` a dimension that is not a fixed size."""
    known = model.boundary_type(name)
    if known is None or not known.type.tensor_type.HasField("shape"):
        return False
    return not all(d.HasField("dim_value") and d.dim_value >= 0 for d in known.type.tensor_type.shape.dim)


def _output(model: Model, name: str, values: Any) -> onnx.ValueInfoProto:
    known = model.boundary_type(name)
    if known is not None and known.type.tensor_type.elem_type:
        return known if name in model.output_names else _ranked(known, values(name).ndim)
    value = values(name)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), [None] * value.ndim)


# ---------------------------------------------------------------------------------------------- the models


def _oracle_values(model: Model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor's value from one in-process ONNX Runtime run of the probe model (no optimization)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    probe = model.with_outputs(model.intermediate_names())
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {**inputs, **dict(zip(names, session.run(names, inputs), strict=True))}


def _host() -> tuple[Model, dict[str, np.ndarray]]:
    host = host_network(300)
    return load_model(host.model), dict(host.inputs)


def _silero() -> tuple[Model, dict[str, np.ndarray]]:
    model = load_model(silero_vad())
    rng = np.random.default_rng(0)
    return model, {"input": rng.standard_normal((1, 512)).astype(np.float32),
                   "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


def _real(path: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[Model, dict[str, np.ndarray]]:
    model = load_model(path)
    return model, random_inputs(model, shapes=shapes)


MODELS = {
    "host-300": _host,
    "silero-vad": _silero,
    "magika": lambda: _real(magika(), {"bytes": (1, 2048)}),
    "ppocr-cls": lambda: _real(rapidocr_model(), {"x": (1, 3, 48, 192)}),
    # dynamic dims, an LSTM whose Y_h and Y_c no node reads, initializers read out of their order
    "bilstm-tagger": lambda: (load_model(bilstm_tagger()), bilstm_inputs()),
}


def _subsets(size: int, seed: int = 0) -> list[frozenset[int]]:
    """The whole model, random subsets of 1 node to all but one, and topological slices (bisection's)."""
    rng = random.Random(seed)
    subsets = [frozenset(range(size))]
    sizes = sorted({k for k in (1, 2, 5, size // 10, size // 2, size - 1) if 1 <= k <= size})
    subsets += [frozenset(rng.sample(range(size), k)) for k in sizes for _ in range(3)]
    subsets += [frozenset(range(start, min(size, start + k))) for k in (3, max(1, size // 3))
                for start in (0, size // 4, size // 2)]
    return subsets


def _space(model: Model, inputs: dict[str, np.ndarray], values: dict[str, np.ndarray], tmp_path: Path, *,
           stored: bool | str, reads: list[str] | None = None) -> SubgraphSpace:
    """A space fed from ``values``; ``stored``: the intermediates in an activation store, as reduce has them
    (the space then declares their cut points from its index and names them in the feeds); ``"on touch"``:
    declared the first time a candidate cuts there (``declare_ahead=False``, as compare's run alone)."""
    if not stored:
        return SubgraphSpace(model, values.__getitem__, tmp_path)
    store = ActivationStore(tmp_path / "activations", autoflush=False)
    for name, value in values.items():
        if name not in inputs:
            store.put(name, value)
    store.flush()

    def value(name: str) -> Any:
        if reads is not None:
            reads.append(name)
        return inputs[name] if name in inputs else store.get(name)

    return SubgraphSpace(model, value, tmp_path / "candidates", store=store, declare_ahead=stored != "on touch")


@pytest.mark.parametrize("stored", [False, True, "on touch"], ids=["values", "store", "store-on-touch"])
@pytest.mark.parametrize("name", MODELS)
def test_candidates_are_byte_identical_to_the_reference(name: str, stored: bool, tmp_path: Path) -> None:
    model, inputs = MODELS[name]()
    values = _oracle_values(model, inputs)
    space = _space(model, inputs, values, tmp_path, stored=stored)
    for keep in _subsets(space.size):
        candidate = space.materialize(keep)
        proto, feeds, outputs = _reference(space, keep)
        assert candidate.data == proto.SerializeToString(), f"{name}: {len(keep)} nodes"
        assert list(candidate.feeds) == feeds and list(candidate.outputs) == outputs
        assert candidate.proto == proto
        assert candidate.digest == model_digest(proto)  # what the tester records as the model that ran
        assert candidate.output_types == tuple(v.type.tensor_type.elem_type for v in proto.graph.output)
        for feed in feeds:
            assert np.array_equal(candidate.feeds[feed], values[feed])
        if stored:  # what the worker reads from the store itself: every stored feed
            assert isinstance(candidate.feeds, StoredFeeds)
            assert candidate.feeds.stored() == [feed for feed in feeds if feed not in inputs]


@pytest.mark.parametrize("stored", [False, True], ids=["values", "store"])
@pytest.mark.parametrize("name", MODELS)
def test_the_whole_node_set_is_the_original_model(name: str, stored: bool, tmp_path: Path) -> None:
    """``materialize(all nodes)`` is the user's model byte for byte — its inputs as declared (PP-OCR's
    ``[-1, 3, ?, ?]`` too), its outputs only (not an LSTM's unused ``Y_h``), in its order — less what no node
    reads: initializers nothing reads and ``value_info`` of tensors no node computes (silero_vad has both)."""
    model, inputs = MODELS[name]()
    space = _space(model, inputs, _oracle_values(model, inputs), tmp_path, stored=stored)
    whole = space.materialize(range(space.size), inline_weights=True)
    expected = onnx.ModelProto()
    expected.CopyFrom(model.proto)
    read = {name for node in model.nodes for name in node_dependencies(node)}
    produced = {name for node in model.nodes for name in node.output}
    kept = [t for t in expected.graph.initializer if t.name in read]
    del expected.graph.initializer[:]
    expected.graph.initializer.extend(kept)
    declared = [v for v in expected.graph.value_info if v.name in produced]
    del expected.graph.value_info[:]
    expected.graph.value_info.extend(declared)
    assert whole.data == expected.SerializeToString()
    assert list(whole.outputs) == list(model.output_names) and list(whole.feeds) == list(model.input_names)
    assert space.boundary(range(space.size))[2] == list(model.output_names)  # so plan() needs no confirming run


def test_a_first_touch_of_stored_cut_points_reads_only_their_constants(tmp_path: Path) -> None:
    """With the store, every cut point is declared when the space is made, from the store's index: a
    candidate reads no stored value (the small integer constants were read then, once), whatever it cuts."""
    model, inputs = MODELS["magika"]()
    values = _oracle_values(model, inputs)
    reads: list[str] = []
    space = _space(model, inputs, values, tmp_path, stored=True, reads=reads)
    constants = set(reads)
    assert constants and all(values[name].dtype.kind in "biu" for name in constants)
    reads.clear()
    for keep in _subsets(space.size, seed=3):
        candidate = space.materialize(keep)
        assert set(candidate.feeds.stored()) >= {feed for feed in candidate.feeds if feed not in inputs}
    assert set(reads) <= set(inputs)


def test_a_space_for_one_candidate_declares_only_what_it_cuts(tmp_path: Path) -> None:
    """``declare_ahead=False`` (compare running failing regions alone, one candidate): making the space reads
    and declares nothing; candidates read no stored value but the small integer constants they cut at (once
    each: they are kept), and name every other fed tensor in the store for the worker."""
    model, inputs = MODELS["magika"]()
    values = _oracle_values(model, inputs)
    reads: list[str] = []
    space = _space(model, inputs, values, tmp_path, stored="on touch", reads=reads)
    assert not reads and space.declare_seconds == 0.0
    for keep in _subsets(space.size, seed=3):
        candidate = space.materialize(keep)
        assert set(candidate.feeds.stored()) >= {feed for feed in candidate.feeds if feed not in inputs}
    constants = [name for name in reads if name not in inputs]
    assert constants and all(values[name].dtype.kind in "biu" for name in constants)
    assert len(constants) == len(set(constants)) and space.declare_seconds > 0.0


def test_a_saved_candidate_runs_and_reads_its_weights(tmp_path: Path) -> None:
    """The bytes written by ``Candidate.save`` are a model ONNX Runtime loads beside ``weights.bin``."""
    model, inputs = MODELS["magika"]()
    values = _oracle_values(model, inputs)
    space = SubgraphSpace(model, values.__getitem__, tmp_path)
    keep = frozenset(range(space.size // 3, 2 * space.size // 3))
    candidate = space.materialize(keep)
    assert any(t.data_location == TensorProto.EXTERNAL for t in candidate.proto.graph.initializer)
    path = candidate.save(tmp_path / "candidate.onnx", durable=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(list(candidate.outputs), dict(candidate.feeds))
    for name, value in zip(candidate.outputs, got, strict=True):
        np.testing.assert_allclose(value, values[name], rtol=1e-4, atol=1e-5)
    inline = space.materialize(keep, inline_weights=True)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in inline.proto.graph.initializer)
    assert [n.name for n in inline.proto.graph.node] == [n.name for n in candidate.proto.graph.node]


def test_candidates_made_in_threads_equal_those_made_one_by_one(tmp_path: Path) -> None:
    """The engine evaluates candidates in threads (``jobs > 1``); pieces are made on first use, shared."""
    model, inputs = _host()
    values = _oracle_values(model, inputs)
    subsets = _subsets(len(model.nodes), seed=1) * 3
    alone = SubgraphSpace(model, values.__getitem__, tmp_path / "alone")
    expected = [alone.materialize(keep).data for keep in subsets]
    shared = SubgraphSpace(model, values.__getitem__, tmp_path / "shared")
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda keep: shared.materialize(keep).data, subsets))
    assert got == expected


# ------------------------------------------------------------------------------------------- the checker


def _unknown_rank_model() -> onnx.ModelProto:
    """An Unsqueeze by computed axes: inference finds no shape for ``u`` and ``r`` (the model's inputs and
    outputs are declared in full). A candidate cut at them declared a graph input by its element type only,
    which ``onnx.checker`` refuses (runtimes accept it); it now declares the captured value's rank (issue 35)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Slice", ["s", "zero", "one"], ["ax"], name="slice"),
             helper.make_node("Unsqueeze", ["x", "ax"], ["u"], name="unsqueeze"),
             helper.make_node("Relu", ["u"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape23"], ["y"], name="reshape")]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "shape23")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _refused_declaration_model() -> onnx.ModelProto:
    """relu → neg, the user declaring ``u`` as an optional without its element type: ``onnx.checker`` passes the
    model (it does not look at ``value_info``) and refuses ``u`` as a graph output, as the declaration says."""
    declared = onnx.ValueInfoProto(name="u")
    declared.type.optional_type.SetInParent()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["u"], name="relu"),
                               helper.make_node("Neg", ["u"], ["y"], name="neg")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], value_info=[declared])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("stored", [False, True], ids=["values", "store"])
@pytest.mark.parametrize("name", ["unknown-rank", "refused-declaration", "host-300", "silero-vad", "magika"])
def test_piecewise_check_gives_the_checkers_verdict_on_every_candidate(name: str, stored: bool,
                                                                        tmp_path: Path) -> None:
    """Given that the whole model passes the checker (the tester's gate), ``check`` refuses exactly the
    candidates ``onnx.checker.check_model`` refuses on file, with its message."""
    if name == "unknown-rank":
        model = load_model(_unknown_rank_model())
        inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}
        assert model.boundary_type("u") is not None and not model.boundary_type("u").type.tensor_type.HasField("shape")
    elif name == "refused-declaration":
        model = load_model(_refused_declaration_model())
        inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}
    else:
        model, inputs = MODELS[name]()
    if name == "refused-declaration":  # ONNX Runtime would not load the probe exposing ``u`` as declared
        values = {**inputs, "u": np.maximum(inputs["x"], 0), "y": -np.maximum(inputs["x"], 0)}
    else:
        values = _oracle_values(model, inputs)
    space = _space(model, inputs, values, tmp_path, stored=stored)
    whole = space.materialize(range(space.size)).save(space.workdir / "whole.onnx")
    if check_file(whole) is not None:
        pytest.skip(f"{name} itself fails onnx.checker: the tester does not gate on it")
    subsets = _subsets(space.size) + [frozenset(s) for s in ({1}, {2}, {1, 2}, {2, 3, 4}, {4})
                                      if max(s) < space.size]
    refused = 0
    for keep in subsets:
        candidate = space.materialize(keep)
        path = candidate.save(space.workdir / "candidate.onnx", durable=False)
        assert space.check(candidate, path) == check_file(path), f"{name}: nodes {sorted(keep)[:8]}"
        refused += check_file(path) is not None
    if name == "unknown-rank":
        assert not refused  # an unshaped cut point or output is declared with its value's rank (issue 35)
    if name == "refused-declaration":
        assert refused  # the rule the test is about did fire, and check saw it


# ------------------------------------------------------------------------------------------- regions apart


def test_regions_apart_read_the_oracles_values_even_where_another_region_computes_them(tmp_path: Path) -> None:
    """Two adjacent regions in one model: the second is fed the oracle's value of the first's output (renamed
    ``::oracle``), so a wrong first region does not reach the second: each says what it computes alone."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"], name="double"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"), helper.make_node("Neg", ["b"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "chain", [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.float32(2), "two")])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    oracle = {"x": np.array([1, -2, 3, -4], np.float32)}
    oracle["a"] = oracle["x"] * 2
    oracle["b"] = np.maximum(oracle["a"], 0)
    oracle["y"] = -oracle["b"]
    wrong = {**oracle, "b": np.full(4, 100, np.float32)}  # the oracle's b, as a cut point, is what feeds Neg
    space = SubgraphSpace(model, wrong.__getitem__, tmp_path)
    both = space.materialize_apart([{0, 1}, {2}])
    assert both.outputs == ("b", "y") and both.keep == frozenset({0, 1, 2})
    assert list(both.proto.graph.node[2].input) == ["b::oracle"] and "b::oracle" in both.feeds
    path = both.save(tmp_path / "apart.onnx")
    onnx.checker.check_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    b, y = session.run(["b", "y"], {name: np.asarray(value) for name, value in both.feeds.items()})
    np.testing.assert_array_equal(b, oracle["b"])  # computed by the first region
    np.testing.assert_array_equal(y, np.full(4, -100, np.float32))  # the second read the fed value, not b
