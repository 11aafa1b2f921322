"""`graphbisect reduce --target openvino` on crashes whose messages carry names OpenVINO chose (issue 23), run as a
user runs it: the CLI on a host model, then the bundle's repro.py and `graphbisect verify`.

* A keepdims=0 ReduceMean → Reshape → MatMul chain that OpenVINO 2026.4.1 fails to compile, in a 352-node host.
  Without the trailing Reshape, OpenVINO names the MatMul after its output, now a graph output: the 3 nodes at
  fault were "a different failure" and the bundle kept 4.
* An If whose condition has shape [1, 1], which OpenVINO refuses naming the node by a per-process number
  (``If_5669``, ``If_6062``): every candidate was "a different failure", the reduction stopped at 176 of 352
  nodes, "NOT PROVEN", "Flaky target: yes".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from graphbisect.examples import host_network
from graphbisect.examples.hosts import HostNetwork

pytestmark = [pytest.mark.openvino, pytest.mark.slow]

_HOST_NODES = 352


def _reduce(tmp: Path, host: HostNetwork) -> tuple[subprocess.CompletedProcess[str], Path]:
    model = tmp / "model.onnx"
    onnx.save(host.model, model)
    bundle = tmp / "bundle"
    proc = subprocess.run([sys.executable, "-m", "graphbisect", "reduce", str(model), "--target", "openvino",
                           "-o", str(bundle)], capture_output=True, text=True, timeout=900, check=False)
    return proc, bundle


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[HostNetwork, subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("openvino")
    host = host_network(_HOST_NODES, bug="reduce_reshape_matmul", position="main")
    return (host, *_reduce(tmp_path_factory.mktemp("chain"), host))


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[HostNetwork, subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("openvino")
    host = host_network(_HOST_NODES, bug="if_rank2_condition", position="main")
    return (host, *_reduce(tmp_path_factory.mktemp("gate"), host))


def test_the_reduce_reshape_matmul_crash_reduces_to_the_three_nodes_at_fault(
        chain: tuple[HostNetwork, subprocess.CompletedProcess[str], Path]) -> None:
    """The bundle kept the trailing Reshape (4 nodes): without it the MatMul's output is a graph output, and
    OpenVINO's message names the MatMul after it."""
    host, proc, bundle = chain
    assert proc.returncode == 1, proc.stdout + proc.stderr  # exit 1: a failure was found and reduced
    report = json.loads((bundle / "report.json").read_text())
    kept = [node["name"] for node in report["kept_nodes"]]
    assert kept == list(host.core_nodes), proc.stdout  # ReduceMean, Reshape, MatMul; not the trailing Reshape
    assert [node["op_type"] for node in report["kept_nodes"]] == ["ReduceMean", "Reshape", "MatMul"]
    assert report["one_minimal"] and report["verified"] and not report["flaky"]
    detail = report["signature"]["detail"]
    assert report["signature"]["kind"] == "crash-load"
    assert "Incompatible MatMul matrix dimension" in detail and "opset1::MatMul <name> (" in detail
    assert "<name>" in report["signature"]["matched_on"]
    _reproduces(bundle)


def test_a_crash_with_per_process_node_numbers_reduces_to_the_node_at_fault(
        gate: tuple[HostNetwork, subprocess.CompletedProcess[str], Path]) -> None:
    """It stopped at 176 of 352 nodes, "NOT PROVEN", flaky; its repro.py said "A DIFFERENT FAILURE"."""
    host, proc, bundle = gate
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((bundle / "report.json").read_text())
    assert [node["name"] for node in report["kept_nodes"]] == list(host.core_nodes) == ["/blk13/gate/If"]
    assert report["one_minimal"] and report["verified"] and not report["flaky"], report["notes"]
    assert "| Flaky target | no |" in (bundle / "report.md").read_text()
    assert "flaky" not in proc.stdout.lower(), proc.stdout
    detail = report["signature"]["detail"]
    assert "Rank of If condition input must be equal to 0 or 1" in detail and "opset8::If <name> (" in detail
    assert "If_" not in detail.replace("If_output", "")  # no per-process number left
    _reproduces(bundle)


def test_a_bundle_recorded_in_another_process_still_verifies(
        gate: tuple[HostNetwork, subprocess.CompletedProcess[str], Path], tmp_path: Path) -> None:
    """A bundle recorded in a worker that had compiled other models (OpenVINO's number was 4242 there) and
    before names were taken out (the number and the names are in its signature and its message): `graphbisect
    verify` re-reads it as today's and says it reproduces."""
    _, _, bundle = gate
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    report = json.loads((old / "report.json").read_text())
    number = re.search(r"opset8::If (If_\d+) ", report["target_message"])
    assert number is not None, report["target_message"]
    report["target_message"] = report["target_message"].replace(number.group(1), "If_4242")
    detail = re.sub(r"opset8::If \S+ \(", "opset8::If If_4242 (", report["signature"]["detail"])
    report["signature"]["detail"] = re.sub(r"friendly_name '[^']*'", "friendly_name 'If_4242'", detail)
    assert "If_4242" in report["signature"]["detail"]
    (old / "report.json").write_text(json.dumps(report))
    verify = subprocess.run([sys.executable, "-m", "graphbisect", "verify", str(old)], capture_output=True,
                            text=True, timeout=600, check=False)
    assert verify.returncode == 1 and "REPRODUCES" in verify.stdout, verify.stdout + verify.stderr


def _reproduces(bundle: Path) -> None:
    """The bundle's repro.py and `graphbisect verify` both say the failure reproduces (exit 1)."""
    repro = subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, timeout=600,
                           check=False)
    assert repro.returncode == 1 and "REPRODUCED" in repro.stdout, repro.stdout + repro.stderr
    assert "A DIFFERENT FAILURE" not in repro.stdout
    verify = subprocess.run([sys.executable, "-m", "graphbisect", "verify", str(bundle)], capture_output=True,
                            text=True, timeout=600, check=False)
    assert verify.returncode == 1 and "REPRODUCES" in verify.stdout, verify.stdout + verify.stderr
