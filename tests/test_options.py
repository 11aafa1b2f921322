"""Option values out of range are refused when the options are built, from Python as from the CLI."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

import graphbisect as gb
from graphbisect.cli.main import main
from graphbisect.engine import Budget
from graphbisect.errors import InputError, OptionError
from graphbisect.workflows.passes import PassesOptions
from graphbisect.workflows.reduce import ReduceOptions
from graphbisect.workflows.triage import TriageOptions

OPTION_CLASSES = (ReduceOptions, PassesOptions, TriageOptions, Budget)

BAD = [
    (ReduceOptions, "jobs", 0), (ReduceOptions, "jobs", 2.5), (ReduceOptions, "jobs", True),
    (ReduceOptions, "max_invocations", -1), (ReduceOptions, "deadline_seconds", -5.0),
    (ReduceOptions, "deadline_seconds", math.nan), (ReduceOptions, "timeout", 0),
    (ReduceOptions, "timeout", math.inf), (ReduceOptions, "max_stall", 0), (ReduceOptions, "fail_code", 0),
    (ReduceOptions, "fail_code", 256), (ReduceOptions, "executor", "bogus"), (ReduceOptions, "fail_regex", "("),
    (ReduceOptions, "target", "onnxruntme"), (ReduceOptions, "oracle", "onnxruntime:no_such_key=1"),
    (PassesOptions, "timeout", -1), (PassesOptions, "max_invocations", -2), (PassesOptions, "target", "nosuch"),
    (TriageOptions, "candidate_jobs", 0), (TriageOptions, "seed", -1), (TriageOptions, "timeout", math.nan),
    (Budget, "max_invocations", -1), (Budget, "deadline_seconds", -0.5), (Budget, "max_stall", 0),
]


@pytest.mark.parametrize(("cls", "name", "value"), BAD, ids=[f"{c.__name__}.{n}={v!r}" for c, n, v in BAD])
def test_a_value_out_of_range_is_refused_at_construction_naming_field_value_and_range(
        cls: type, name: str, value: Any) -> None:
    with pytest.raises(OptionError) as info:
        cls(**{name: value})
    err = info.value
    assert isinstance(err, InputError) and isinstance(err, ValueError)  # old handlers still catch it
    assert err.message.startswith(f"{cls.__name__} {name}={value!r} is not allowed: ")
    assert err.hint, err  # how to fix it: an example of the option, or the parser's own hint (with the cause)
    assert f"{name}=" in err.hint or err.__cause__ is not None, err


@pytest.mark.parametrize("cls", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_defaults_and_values_in_range_are_accepted(cls: type) -> None:
    cls()
    edges = {"jobs": 1, "max_invocations": 0, "deadline_seconds": 0.5, "timeout": 1e-3, "max_stall": 1,
             "fail_code": 255, "executor": "ray:127.0.0.1:6379", "fail_regex": r"CUDA error \d+",
             "target": "openvino:precision=f32", "oracle": "reference", "candidate_jobs": 3, "seed": 0}
    names = {f.name for f in dataclasses.fields(cls)}
    cls(**{key: value for key, value in edges.items() if key in names})


@pytest.mark.parametrize("cls", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_every_numeric_option_declares_its_range(cls: type) -> None:
    """One mechanism: a number field without a declared range would take any value again."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        numeric = {int, float} & set(typing.get_args(hints[field.name]) or (hints[field.name],))
        if numeric and field.name != "stall_per_unit":
            assert field.metadata, f"{cls.__name__}.{field.name} has no declared range"


@pytest.fixture()
def relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_python_api_refuses_before_running_or_writing(relu_model: onnx.ModelProto, tmp_path: Path) -> None:
    # These used to run to completion (jobs=0, a negative budget, an unknown executor) or end in a
    # numpy ValueError (seed=-1) or a 0-second "timeout" of the oracle reported as a backend failure.
    calls = {
        "jobs": lambda: gb.reduce(relu_model, tmp_path / "a", jobs=0),
        "max_invocations": lambda: gb.reduce(relu_model, tmp_path / "a", max_invocations=-1),
        "executor": lambda: gb.reduce(relu_model, tmp_path / "a", executor="bogus"),
        "timeout": lambda: gb.passes(relu_model, timeout=0),
        "seed": lambda: gb.compare(relu_model, seed=-1),
        "max_invocations ": lambda: gb.precision(relu_model, max_invocations=-3),
        "builds": lambda: gb.tactics.isolate(relu_model, builds=1, oracle="reference"),
    }
    for name, call in calls.items():
        with pytest.raises(OptionError, match=rf"\b{name.strip()}=\S+ is not allowed"):
            call()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "flag"), [
    (["compare", "--example", "--seed", "-1"], "--seed"),
    (["reduce", "--example", "--executor", "bogus", "-o", "OUT"], "--executor"),
    (["triage", "IN", "OUT", "--seed", "-3"], "--seed"),
    (["reduce", "--example", "--check", "false", "--fail-code", "300", "-o", "OUT"], "--fail-code"),
])
def test_the_cli_refuses_what_the_options_refuse(args: list[str], flag: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # `compare --seed -1` used to exit 3 ("internal error: ValueError: expected non-negative integer").
    args = [str(tmp_path / a) if a in ("OUT", "IN") else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}" in err and "not allowed" in err
    assert not any(tmp_path.iterdir())  # nothing ran
