"""graphbisect pauses Python's cyclic garbage collector during its bulk steps (loading a model, mapping a compiled
graph, a table of thousands of statistics); a caller's process must get its collector back as it was."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphbisect import load_model
from graphbisect.compare.metrics import compare_many
from graphbisect.storage.gcpause import gc_paused


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_runs_again_when_the_last_of_overlapping_steps_ends() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def second() -> None:
        with gc_paused():
            second_in.set()
            first_out.wait(10)
            seen["second, after the first ended"] = gc.isenabled()

    with gc_paused():
        first_in.set()
        thread = threading.Thread(target=second)
        thread.start()
        assert second_in.wait(10)
        seen["first"] = gc.isenabled()
    first_out.set()
    thread.join(10)
    assert seen == {"first": False, "second, after the first ended": False}
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled_and_an_error_restores_it() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("a step that fails")
    assert gc.isenabled()


def test_the_bulk_steps_leave_the_collector_as_they_found_it() -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    stats = compare_many([(name, np.ones(4, np.float32), np.ones(4, np.float32)) for name in "abc"])
    assert gc.isenabled() and model.nodes[0].name == "relu" and all(s.passed for s in stats)
    gc.disable()
    load_model(model.proto)
    assert not gc.isenabled()
