"""A crash that other runs of the same model survive is flakiness, never the bug (issue 36, item 10).

The target is ONNX Runtime with every optimization (the host's mis-fused LayerNorm included) that dies at random
in 40 % of its runs (:mod:`graphbisect.examples.flaky_target`, a GPU race's behaviour). Seed 8 draws its first
runs of the original crash, crash, complete, crash (then complete, complete): the crash had the majority of the
baseline's runs, and the search chased it (7 minutes, nothing certified, in the attack). Now the baseline is
the completed runs' failure, and a target that completes without failure is reported as flaky, with nothing reduced.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from graphbisect.errors import GraphBisectError
from graphbisect.examples import host_network
from graphbisect.examples.flaky_target import script_path
from graphbisect.model import load_model
from graphbisect.workflows.reduce import ReduceOptions, reduce_model

FLAKY = f"command:cmd={sys.executable} {script_path()} {{model}} {{inputs}} {{outputs}}"


class _Searching(Exception):
    """Raised when the search starts: the baseline, which decides what is searched for, is chosen by then."""


def _reduce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str | None,  # type: ignore[no-untyped-def]
            stages: list[str] | None = None):
    for name, value in (("MODE", "crash"), ("RATE", "0.4"), ("SEED", "8"), ("COUNTER", str(tmp_path / "n"))):
        monkeypatch.setenv(f"FLAKY_{name}", value)
    host = host_network(100, bug=bug, position="main", seed=0)
    return reduce_model(load_model(host.model), tmp_path / "bug", inputs=host.inputs,
                        options=ReduceOptions(oracle="onnxruntime:opt_level=disable", target=FLAKY),
                        on_stage=None if stages is None else lambda text: _stop_at_search(text, stages))


def _stop_at_search(text: str, stages: list[str]) -> None:
    stages.append(text)
    if text.startswith("reducing "):
        raise _Searching


def test_a_flaky_crash_is_not_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The baseline decides what is searched for; the search itself at a 40 % crash rate takes minutes, so the
    # test stops where it starts.
    stages: list[str] = []
    with pytest.raises(_Searching):
        _reduce(tmp_path, monkeypatch, "layernorm_keepdims0", stages)
    chosen = [text for text in stages if "never the baseline" in text]
    assert chosen and "crash-run" in chosen[0], stages  # the crash was seen, and outvoted by what completed
    assert "the completed runs' majority, mismatch" in chosen[0]
    assert "flaky target: a candidate must fail 3 times in a row" in stages[-1]


def test_a_flaky_crash_on_a_passing_model_is_reported_as_flakiness(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GraphBisectError, match=r"died in [0-9]+ of [0-9]+ runs of the same model") as raised:
        _reduce(tmp_path, monkeypatch, None)
    assert "no failure" in str(raised.value) and raised.value.hint and "flaky" in raised.value.hint
    assert not (tmp_path / "bug" / "model.onnx").exists()  # no bundle certifies the injected crash
