"""Issue 24, the smaller items: names on the terminal, resource caps, arguments that were ignored or
accepted silently. Each test failed on the code before the fix; real processes and files, no mocks."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphbisect.cli.main import main
from graphbisect.data import save_inputs
from graphbisect.examples import host_network
from graphbisect.examples.bundled import example_inputs_path, example_model_path
from graphbisect.model import load_model
from graphbisect.text.printable import plural
from graphbisect.workflows.reduce import ReduceOptions, reduce_model


def _renamed_host(tmp_path: Path, suffix: str) -> tuple[Path, Path]:
    host = host_network(100, bug="layernorm_keepdims0", seed=1)
    keep = {o.name for o in host.model.graph.output} | set(host.inputs) | \
        {init.name for init in host.model.graph.initializer}
    for i, node in enumerate(host.model.graph.node):
        node.name = f"n{i}{suffix}"
        for slots in (node.input, node.output):
            for j, name in enumerate(slots):
                if name and name not in keep:
                    slots[j] = name + suffix
    onnx.save(host.model, tmp_path / "m.onnx")
    save_inputs(tmp_path / "in.npz", host.inputs)
    return tmp_path / "m.onnx", tmp_path / "in.npz"


def test_newlines_in_names_cannot_forge_a_line_of_the_table(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs = _renamed_host(tmp_path, "\nPASS: outputs match\r")
    assert main(["compare", str(model), "--inputs", str(inputs)]) == 1
    out = capsys.readouterr().out
    # The names' newline started a line "PASS: outputs match" inside the table; \r rewrote the line shown.
    assert not [line for line in out.splitlines() if line.startswith("PASS")], out
    assert "\r" not in out
    assert "\\nPASS: outputs match\\r" in out  # shown, escaped


def test_jobs_beyond_the_cpus_are_capped_with_a_note_and_resume_refuses_other_inputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bug"
    assert main(["reduce", "--example", "-o", str(out), "-j", "100000", "--max-invocations", "0"]) == 1
    captured = capsys.readouterr()
    # -j 100000 was accepted as asked: a worker process per candidate, on a 2-CPU machine.
    cpus = plural(len(os.sched_getaffinity(0)), "CPU")
    assert f"-j 100000 is more workers than the {cpus}" in captured.out + captured.err
    other = tmp_path / "other.npz"
    feeds = dict(np.load(example_inputs_path()))
    name = next(iter(feeds))
    feeds[name] = feeds[name] + 1
    np.savez(other, **feeds)
    # --resume with --inputs ran the recorded inputs and ignored these without a word.
    assert main(["reduce", "--resume", str(out), "--inputs", str(other)]) == 2
    assert f"--inputs {other} differ from it" in capsys.readouterr().err
    same = tmp_path / "same.npz"
    shutil.copy(example_inputs_path(), same)
    assert main(["reduce", "--resume", str(out), "--inputs", str(same), "--max-invocations", "0"]) == 1


def test_a_json_number_beyond_float64_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, [2])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    inputs = tmp_path / "inputs.json"
    inputs.write_text('{"x": [1e999, 1.0]}')
    # It read inf (with a warning about non-finite inputs), though the docs say such values are refused.
    assert main(["compare", str(model), "--inputs", str(inputs), "--no-layerwise"]) == 2
    assert "the number 1e999 is beyond the range of a float64" in capsys.readouterr().err


def test_triage_names_the_entries_it_does_not_triage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from graphbisect.workflows.triage import discover_models

    (tmp_path / "a.onnx").write_bytes(example_model_path().read_bytes())
    shutil.copy(example_inputs_path(), tmp_path / "a.npz")  # a's inputs: used, not named
    (tmp_path / "b.ONNX").write_bytes(example_model_path().read_bytes())
    (tmp_path / "c.onnx").symlink_to(tmp_path / "gone.onnx")
    with caplog.at_level(logging.WARNING):
        assert [name for name, _, _ in discover_models(tmp_path)] == ["a"]
    # b.ONNX and the broken link were skipped without a word.
    assert "'b.ONNX', 'c.onnx'" in caplog.text and "'a.npz'" not in caplog.text


def test_ctrl_c_in_the_final_facts_is_said(tmp_path: Path) -> None:
    host = host_network(100, bug="layernorm_keepdims0", position="branch", seed=2)

    def interrupt(text: str) -> None:
        if text.startswith("finding the lowest optimization level"):
            raise KeyboardInterrupt

    result = reduce_model(load_model(host.model), tmp_path / "bug", inputs=host.inputs,
                          options=ReduceOptions(layerwise=False), on_stage=interrupt)
    # The CLI printed "1-minimal: yes" and no word of it: only report.json had "interrupted".
    assert result.one_minimal and any("interrupted (Ctrl-C) while measuring the facts" in n for n in result.notes)
    assert result.interrupted and result.to_json()["interrupted"]  # the CLI exits 130, as for any Ctrl-C
