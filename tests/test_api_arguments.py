"""Every public function checks its arguments before anything runs (issue 36 item 8): a number for a path, a
list for a tolerance, ``check=42`` or ``trust="no"`` is an :class:`OptionError` (an ``InputError`` and a
``ValueError``) naming the function, the argument and what it accepts.

They raised ``AttributeError``, ``TypeError`` or numpy's ``ValueError``; ``check=42`` was refused only after both
backends had run, and ``audit(trust="no")`` trusted. Each case failed before the check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import graphbisect as gb
from graphbisect.errors import InputError, OptionError
from graphbisect.examples.bundled import example_model_path

_MODEL = str(example_model_path())

#: (function, arguments, the argument named, a word of what it accepts)
_HOSTILE: list[tuple[Callable[..., Any], dict[str, Any], str, str]] = [
    (gb.compare, {"model": 42}, "model", "path"),
    (gb.compare, {"model": _MODEL, "inputs": 42}, "inputs", "mapping"),
    (gb.compare, {"model": _MODEL, "tolerance": [1e-3]}, "tolerance", "Tolerance"),
    (gb.compare, {"model": _MODEL, "oracle": 42}, "oracle", "backend spec"),
    (gb.compare, {"model": _MODEL, "target": None}, "target", "backend spec"),
    (gb.compare, {"model": _MODEL, "shapes": {"x": "ab"}}, "shapes", "whole numbers"),
    (gb.compare, {"model": _MODEL, "workdir": 5}, "workdir", "path"),
    (gb.compare, {"model": _MODEL, "check": 42}, "check", "callable"),
    (gb.compare, {"model": _MODEL, "on_stage": 5}, "on_stage", "callable"),
    (gb.compare, {"model": _MODEL, "layerwise": "no"}, "layerwise", "True or False"),
    (gb.reduce, {"model": _MODEL, "output": 5}, "output", "path"),
    (gb.reduce, {"model": _MODEL, "output": "out", "check": 42}, "check", "shell command"),
    (gb.passes, {"model": _MODEL, "tolerance": "a"}, "tolerance", "Tolerance"),
    (gb.precision, {"model": _MODEL, "mode": 5}, "mode", "precision mode"),
    (gb.precision, {"model": _MODEL, "output": 5}, "output", "path"),
    (gb.verify, {"bundle": 5}, "bundle", "path"),
    (gb.verify, {"bundle": "b", "target": 5}, "target", "backend spec"),
    (gb.verify, {"bundle": "b", "model": object()}, "model", "path"),
    (gb.audit, {"bundle": None}, "bundle", "path"),
    (gb.audit, {"bundle": "b", "trust": "no"}, "trust", "True or False"),
    (gb.triage, {"input_dir": 5, "output": "out"}, "input_dir", "path"),
    (gb.load_model, {"source": 3.5}, "source", "path"),
    (gb.tactics.record, {"model": 42}, "model", "path"),
]


@pytest.mark.parametrize("case", _HOSTILE, ids=[f"{f.__name__}-{n}" for f, _, n, _ in _HOSTILE])
def test_a_hostile_argument_is_refused_naming_it(case: tuple[Callable[..., Any], dict[str, Any], str, str],
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    function, arguments, name, accepts = case
    monkeypatch.chdir(tmp_path)  # nothing may be written, and nothing is: the refusal comes first
    started = time.monotonic()
    with pytest.raises(OptionError) as raised:
        function(**arguments)
    assert isinstance(raised.value, InputError) and isinstance(raised.value, ValueError)
    assert f"{name}=" in raised.value.message and accepts in raised.value.message, raised.value
    assert raised.value.hint and raised.value.hint.startswith(f"e.g. {name}=")
    assert time.monotonic() - started < 5.0  # before any backend runs (check=42 was refused after both had)
    assert list(tmp_path.iterdir()) == []


def test_a_ragged_list_for_a_tensor_input_is_an_input_error() -> None:
    with pytest.raises(InputError, match="inputs: a value cannot be read"):  # numpy's ValueError before
        gb.compare(_MODEL, inputs={"x": [[1.0, 2.0], [3.0]]})


def test_accepted_values_still_pass_the_check() -> None:
    import numpy as np

    from graphbisect.compare import Tolerance

    found = gb.compare(_MODEL, layerwise=np.bool_(False), tolerance=Tolerance(atol=np.float32(1.0), rtol=1.0),
                       shapes=None, workdir=None, check=lambda outputs, expected: True)
    assert found.check_passed is True
