"""Issue 16: hostile input and clumsy use — nothing leaks, nothing is lost, nothing false is certified.

One test (or a parametrized family) per numbered item of the issue; each failed on the code before the fix.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.compare import Tolerance
from graphbisect.errors import InputError
from graphbisect.examples.bundled import example_inputs_path, example_model_path

EXAMPLE = [str(example_model_path()), "--inputs", str(example_inputs_path())]


# --- item 7: arguments are validated when parsed; an internal error is exit 3, never 1 ------------------
@pytest.mark.parametrize("bad", [
    ["--atol", "nan"], ["--rtol", "inf"], ["--atol", "-1"], ["--min-cosine", "2"], ["--tol", "y:nan"],
    ["--target", "onnxruntime:timeout=inf"], ["--target", "onnxruntime:timeout=nan"],
])
def test_item7_compare_refuses_values_that_would_pass_a_failing_model(bad: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    # The bundled example fails on ONNX Runtime; a NaN or infinite tolerance used to make it PASS (exit 0).
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *EXAMPLE, "--no-layerwise", *bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and bad[0] in err


@pytest.mark.parametrize("bad", [
    ["-j", "0"], ["--max-invocations", "-1"], ["--fail-regex", "("], ["--deadline", "nan"], ["--timeout", "inf"],
    ["-o", "/proc/graphbisect-x"], ["--json", "/proc/graphbisect-x.json"],
])
def test_item7_reduce_refuses_bad_arguments_before_any_run(bad: list[str], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ["reduce", "--example", *bad] + ([] if bad[0] == "-o" else ["-o", str(tmp_path / "b")])
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert "error: argument" in capsys.readouterr().err
    assert not (tmp_path / "b.work").exists()  # nothing ran


def test_item7_unknown_tolerance_name_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compare", *EXAMPLE, "--no-layerwise", "--tol", "nosuch:1"]) == 2
    assert "no tensor 'nosuch'" in capsys.readouterr().err


def test_item7_tolerance_api_refuses_nan_and_inf() -> None:
    for kwargs in ({"atol": float("nan")}, {"rtol": float("inf")}, {"atol": -1.0}, {"min_cosine": 2.0},
                   {"per_output": {"y": (float("nan"), 0.0)}}):
        with pytest.raises(InputError):
            Tolerance(**kwargs)  # type: ignore[arg-type]


def test_item7_internal_error_exits_3_not_1(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from graphbisect.cli import compare_cmd

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(compare_cmd, "run", broken)
    assert main(["compare", *EXAMPLE]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "report" in err
