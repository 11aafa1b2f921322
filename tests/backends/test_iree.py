"""The iree backend (ONNX import → iree-compile for llvm-cpu → iree.runtime) on real IREE bugs.

Each model is a residual CNN with one public IREE bug embedded (graphbisect/examples/iree_bugs.py, verified on
iree-base-compiler 3.13.0rc20261016): ``reduce`` must return the small failing model the upstream report
needed, ``passes`` must name the compiler feature to switch off, and the bundle must replay through
``repro.py`` (IREE packages only) and ``graphbisect verify``. The diagnostics in the unit tests are real
``iree-compile`` output captured here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from graphbisect.backends import BackendSpec, resolve
from graphbisect.backends.iree import CACHE_ENV, FEATURES, IreeOptions, compile_diagnostic, dispatch_nodes
from graphbisect.cli.main import main
from graphbisect.errors import SpecError
from graphbisect.examples.iree_bugs import iree_bug_model
from graphbisect.model import load_model
from graphbisect.workflows.passes import NOT_NEEDED, PassesOptions, PassesResult, find_culprit_passes

iree_installed = pytest.mark.skipif(not resolve("iree", require_available=False)[1].availability().available,
                                    reason="iree-base-compiler is not installed (pip install 'graphbisect[iree]')")

# Real iree-compile 3.13 output (paths and the long stack shortened).
UNPOOL_ERROR = (
    '<unknown>:0: error: loc("site/unpool"): failed to legalize operation \'torch.aten.max_unpool2d\' that was '
    'explicitly marked illegal: %460 = "torch.aten.max_unpool2d"(%458, %385#1, %459) : (!torch.vtensor<[1,4,4,4],'
    'f32>, !torch.vtensor<[1,4,4,4],si64>, !torch.list<int>) -> !torch.vtensor<[1,4,8,8],f32> loc("site/unpool")\n')
DFT_ERROR = (
    '<unknown>:0: error: loc(""): failed to legalize operation \'torch.operator\' that was explicitly marked '
    'illegal: %1 = "torch.operator"(%arg0) <{name = "onnx.DFT"}> : (!torch.vtensor<[1,8,1],f32>) -> '
    '!torch.vtensor<[1,8,2],f32> loc("")\n')
SEGFAULT = """Please report issues to https://github.com/iree-org/iree/issues and include the crash backtrace.
Stack dump:
0.\tProgram arguments: /tmp/venv/lib/python3.11/site-packages/iree/compiler/_mlir_libs/iree-compile /tmp/w1/model.mlir
 #0 0x00007f4f7175a0ab llvm::sys::PrintStackTrace(llvm::raw_ostream&, int) Signals.cpp:0:0
 #1 0x00007f4f717571fe llvm::sys::RunSignalHandlers() Signals.cpp:0:0
 #2 0x00007f4f7175ac10 SignalHandler(int, siginfo_t*, void*) Signals.cpp:0:0
 #3 0x00007f4f6b85a050 (/lib/x86_64-linux-gnu/libc.so.6+0x3c050)
 #4 0x00007f4f7186e996 mlir::Type::getContext() const Types.cpp:0:0
 #5 0x00007f4f71872362 (anonymous namespace)::OperationVerifier::verifyOpAndDominance(mlir::Operation&) Verifier.cpp:0:0
 #6 0x00007f4f71871572 mlir::verify(mlir::Operation*, bool) Verifier.cpp:0:0
"""


# ------------------------------------------------------------------------------------ no compiler needed
def test_compile_diagnostic_keeps_op_and_onnx_name_but_not_locations_or_ssa_names() -> None:
    unpool = compile_diagnostic(UNPOOL_ERROR, 1)
    assert unpool.startswith("failed to legalize operation 'torch.aten.max_unpool2d'")
    assert "loc(" not in unpool and "%" not in unpool and "site/unpool" not in unpool
    assert "!torch.vtensor<[1,4,4,4],f32>" in unpool  # the failing op's types stay
    renumbered = UNPOOL_ERROR.replace("%460", "%12").replace("%458", "%3").replace("%385#1", "%0#1")
    assert compile_diagnostic(renumbered.replace("site/unpool", "unpool_7"), 1) == unpool
    dft = compile_diagnostic(DFT_ERROR, 1)
    assert '<{name = "onnx.DFT"}>' in dft and dft != unpool  # another unsupported op is another failure


def test_compile_crash_signature_is_signal_and_innermost_frames_without_addresses_or_paths() -> None:
    key = compile_diagnostic(SEGFAULT, -11)
    assert key == ("iree-compile crashed (signal 11); in mlir::Type::getContext() const <- "
                   "(anonymous namespace)::OperationVerifier::verifyOpAndDominance(mlir::Operation&)")
    moved = SEGFAULT.replace("0x00007f4f", "0x00007f11").replace("/tmp/w1/", "/tmp/w2/")
    assert compile_diagnostic(moved, -11) == key


def test_options_are_checked_before_any_compile() -> None:
    assert IreeOptions.parse({"disabled": "const-eval;ukernels", "flags": "--iree-opt-level=O0"}).compile_flags() \
        == [FEATURES["const-eval"], FEATURES["ukernels"], "--iree-opt-level=O0"]
    with pytest.raises(SpecError, match="no feature 'const_eval'"):
        IreeOptions.parse({"disabled": "const_eval"})
    with pytest.raises(SpecError, match="not a compiler flag"):
        IreeOptions.parse({"flags": "iree-opt-level=O0"})
    with pytest.raises(SpecError, match="not a CPU device"):
        IreeOptions.parse({"device": "cuda"})


def test_dispatch_view_ignores_helpers_that_carry_another_nodes_location() -> None:
    source = ('%5 = tensor.empty() : tensor<4x8x8xf32> loc("stem/conv")\n'
              '%6 = linalg.fill ins(%cst : f32) outs(%5 : tensor<4x8x8xf32>) -> tensor<4x8x8xf32> loc("stem/conv")\n'
              '%7 = linalg.generic {indexing_maps = [#map]} ins(%3 : tensor<4x8x8xf32>) outs(%6) {\n'
              '^bb0(%in: f32 loc("block0/conv1"), %out: f32 loc("stem/conv")):\n'
              '} -> tensor<4x8x8xf32> loc(#loc4)\n'
              '#loc4 = loc(fused["block0/conv2", "block0/add"])\n')
    assert dispatch_nodes(source, {"stem/conv", "block0/conv1", "block0/conv2", "block0/add"}) == \
        ["block0/conv2", "block0/add"]


# ------------------------------------------------------------------------------------- real IREE runs
def _save(directory: Path, bug: str, **kwargs: Any) -> tuple[Path, Path]:
    model, inputs, _ = iree_bug_model(bug, **kwargs)
    path, feeds = directory / f"{bug}.onnx", directory / f"{bug}.npz"
    onnx.save(model, path)
    np.savez(feeds, **inputs)
    return path, feeds


def _reduce(tmp_path: Path, bug: str) -> tuple[dict[str, Any], Path]:
    """`reduce --target iree` on the host with ``bug``: its report (``kept`` = the kept node names) and bundle."""
    model, inputs = _save(tmp_path, bug)
    bundle = tmp_path / "bundle"
    assert main(["reduce", str(model), "--inputs", str(inputs), "--target", "iree", "-o", str(bundle)]) == 1
    report = json.loads((bundle / "report.json").read_text())
    report["kept"] = [node["name"] for node in report["kept_nodes"]]
    return report, bundle


@iree_installed
def test_maxunpool_compile_failure_reduces_to_the_unpool_and_replays(tmp_path: Path) -> None:
    """nod-ai/AMD-SHARK-ModelDev#718: torch.aten.max_unpool2d has no lowering; the SegNet pool/unpool pair in
    a 22-node CNN reduces to the MaxUnpool alone (its indices fed as a constant), same diagnostic."""
    report, bundle = _reduce(tmp_path, "maxunpool")
    assert report["signature"]["kind"] == "crash-load"
    assert "IreeCompileError: failed to legalize operation 'torch.aten.max_unpool2d'" in report["signature"]["detail"]
    assert report["original_nodes"] == 22 and report["kept"] == ["site/unpool"]
    assert report["one_minimal"] and report["invocations"]["target"] <= 20
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run([sys.executable, str(bundle / "repro.py")], check=False, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout
    assert not list(tmp.iterdir())  # the script's imported and compiled module are removed when it ends


@iree_installed
def test_gridsample_wrong_result_reduces_to_the_grid_sample_and_verifies(tmp_path: Path) -> None:
    """iree-org/iree#24378 (gridsample nearest): x.5 rounded away from zero; 20 nodes → the GridSample."""
    report, bundle = _reduce(tmp_path, "gridsample")
    assert report["signature"]["kind"] == "mismatch"
    assert report["kept"] == ["site/grid_sample"] and report["one_minimal"]
    assert report["invocations"]["target"] <= 8  # layerwise evidence points at the dispatch that holds it
    assert main(["verify", str(bundle)]) == 1


@iree_installed
def test_compare_maps_the_diverging_dispatch_back_to_onnx_nodes(tmp_path: Path) -> None:
    model, inputs = _save(tmp_path, "gridsample")
    assert main(["compare", str(model), "--inputs", str(inputs), "--target", "iree",
                 "--json", str(tmp_path / "c.json")]) == 1
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["compiled_graph"]["source"] == "IREE dispatches"
    dispatch = data["first_divergence"]["compiled_as"]  # the first diverging tensor's dispatch
    assert dispatch["kind"] == "dispatch" and "site/grid_sample" in dispatch["originals"]
    assert "stem/conv" not in dispatch["originals"]  # shared helpers do not smear the view
    # the element types the dispatch computes on (issue 26): this model is f32 throughout, and so is IREE
    assert dispatch["precision"] == ["f32"] and dispatch["model_precision"] and not dispatch["lower_precision"]


@iree_installed
def test_two_compiler_failures_reduce_to_the_reported_one_without_drifting(tmp_path: Path) -> None:
    """iree-org/iree#24230: Unique crashes iree-compile (SIGSEGV). With MaxUnpool (a compile error) before it in
    one model, the compiler's crash (reported first) reduces to the Unique alone: candidates that drop the Unique
    fail with the max_unpool2d diagnostic, a different failure that is never accepted. (The Unique alone in a
    host reduces the same way: this model holds that reduction and the drift it must refuse.)"""
    model, inputs, _ = iree_bug_model("maxunpool", second="unique")
    path, feeds = tmp_path / "two.onnx", tmp_path / "two.npz"
    onnx.save(model, path)
    np.savez(feeds, **inputs)
    bundle = tmp_path / "bundle"
    assert main(["reduce", str(path), "--inputs", str(feeds), "--target", "iree", "-o", str(bundle),
                 "--keep-work"]) == 1
    report = json.loads((bundle / "report.json").read_text())
    assert report["signature"]["kind"] == "crash-load"
    assert report["signature"]["detail"].startswith("IreeCompileError: iree-compile crashed (signal 11)")
    assert [node["name"] for node in report["kept_nodes"]] == ["site2/unique"] and report["one_minimal"]
    journal = [json.loads(line) for line in (tmp_path / "bundle.work" / "journal.jsonl").read_text().splitlines()]
    refused = [entry for entry in journal if entry.get("outcome") == "unresolved"
               and "max_unpool2d" in json.dumps(entry.get("detail", {}))]
    assert refused  # the drift was offered and refused


@pytest.fixture(scope="module")
def f64_passes(tmp_path_factory: pytest.TempPathFactory) -> PassesResult:
    """``passes --target iree`` on the f64-output bug (one search, ~20 s: two tests read it)."""
    model, inputs, _ = iree_bug_model("f64-output", blocks=1)
    return find_culprit_passes(load_model(model), inputs=inputs, workdir=tmp_path_factory.mktemp("f64-passes"),
                               options=PassesOptions(target="iree"))


@iree_installed
def test_f64_demotion_is_named_as_the_culprit_feature(f64_passes: PassesResult) -> None:
    """iree-org/iree#24180: IREE demotes f64 to f32 by default but exports an f64 result buffer, so the call
    fails at run time; `passes` names demote-f64-to-f32 and its flag is the workaround."""
    result = f64_passes
    assert result.signature.kind.value == "crash-run"
    assert "buffer view byte length" in result.signature.detail
    assert result.culprits == ("demote-f64-to-f32",) and result.required == ("demote-f64-to-f32",)
    fixed = BackendSpec.parse(str(result.fixed_target))
    assert IreeOptions.parse(fixed.options).compile_flags() == ["--iree-input-demote-f64-to-f32=false"]
    assert result.fixed_flags == "--iree-input-demote-f64-to-f32=false"  # the line a user adds to iree-compile


@iree_installed
def test_a_pass_that_explains_it_is_found_without_listing_what_fired(f64_passes: PassesResult) -> None:
    """Listing which features fired is 2 + one compile per feature (16), more than a search over all 14 costs:
    with every feature disabled the failure goes, and the search runs over every feature without the listing
    (on the 12-node model: 19 compiles and 5 cache hits with the listing). The enable-set search tries the
    disable-set first: one culprit's enable-set is that one run, not a second search over the 14 (9 compiles
    in all, 12 and 2 cache hits with the second search)."""
    result = f64_passes
    assert result.source == NOT_NEEDED and result.fired == ()  # not measured, so not claimed
    assert result.search["enable"]["invocations"] == 1 and result.minimal
    assert set(result.searched) == set(FEATURES)
    target = result.backend_calls["target"]
    assert target["runs"] == result.invocations["target"]
    assert target["compiles"] + target["compile_cache_hits"] == target["runs"]  # each run its module, no listing
    assert target["compiles"] < 2 + len(FEATURES)  # fewer than the listing alone would have compiled


@iree_installed
def test_a_failure_no_pass_explains_is_decided_in_one_compile(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """iree-org/iree#24378, GridSample's kernel rounds x.5 away from zero: no compiler feature explains it. One
    compile with every feature disabled decides that; listing which features fired (a compile per feature, 16
    of the 29 compiles on a 156-node host) is not needed for the answer, and the result does not claim a list."""
    model, inputs, _ = iree_bug_model("gridsample", blocks=1)
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["passes", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"), "--target", "iree",
                 "--oracle", "reference", "--json", str(tmp_path / "r.json")]) == 1
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["failed"] and result["signature"]["kind"] == "mismatch"
    assert result["culprits"] == [] and any("no set of passes explains" in note for note in result["notes"])
    assert result["source"] == NOT_NEEDED and result["fired"] == []
    assert set(result["searched"]) == set(FEATURES)  # what was disabled: every feature
    target = result["backend_calls"]["target"]
    assert target["runs"] == result["invocations"]["target"] == 2  # the baseline, then every feature disabled
    assert target["compiles"] + target["compile_cache_hits"] <= 1 + 3  # the baseline's compile and at most 3 more
    assert "fired passes: not listed (not needed: with all 14 disable-able passes disabled" in capsys.readouterr().out


@pytest.fixture(scope="module")
def own_cache_entries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """A folder with two models (Relu, Sigmoid) and the entry each left in its own compare's compile cache."""
    folder = tmp_path_factory.mktemp("own-cache")
    entries = {}
    for op in ("Relu", "Sigmoid"):
        path, feeds = _tiny(folder, op.lower(), [onnx.helper.make_node(op, ["x"], ["y"])],
                            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 1])])
        assert main(["compare", str(path), "--inputs", str(feeds), "--target", "iree", "--no-layerwise",
                     "--workdir", str(folder / f"work-{op}")]) == 0
        (entries[op],) = (folder / f"work-{op}" / "compile-cache").glob("*.vmfb")
    return folder, entries


@iree_installed
@pytest.mark.parametrize("planted", ["error", "module"])
def test_an_inherited_compile_cache_is_never_used(own_cache_entries: tuple[Path, dict[str, Path]], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  planted: str) -> None:
    """A compile cache is a run's own folder. One named by an inherited GRAPHBISECT_COMPILE_CACHE was used by
    ``compare`` (issue 36): a planted ``<key>.error`` made a passing model crash at load, another model's module
    copied under the key (native code IREE loads) made it differ. Both are ignored now; the folder is untouched."""
    models, entries = own_cache_entries
    cache = tmp_path / "planted"
    cache.mkdir()
    key = entries["Relu"].name
    if planted == "error":
        (cache / key).with_suffix(".error").write_text("planted: not what iree-compile said", encoding="utf-8")
    else:
        (cache / key).write_bytes(entries["Sigmoid"].read_bytes())
    monkeypatch.setenv(CACHE_ENV, str(cache))
    capsys.readouterr()
    assert main(["compare", str(models / "relu.onnx"), "--inputs", str(models / "relu.npz"),
                 "--target", "iree", "--no-layerwise"]) == 0
    assert "PASS: outputs match" in capsys.readouterr().out
    assert [f.name for f in cache.iterdir()] == [(cache / key).with_suffix(".error").name if planted == "error"
                                                 else key]


def _tiny(tmp_path: Path, name: str, nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], *,
          initializers: tuple[onnx.TensorProto, ...] = ()) -> tuple[Path, Path]:
    """A two-node model (opset 17) on input x (float32 [1, 8, 1]) and its inputs file."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 1])
    graph = onnx.helper.make_graph(nodes, name, [x], outputs, list(initializers))
    path, feeds = tmp_path / f"{name}.onnx", tmp_path / f"{name}.npz"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
    np.savez(feeds, x=np.random.default_rng(0).standard_normal((1, 8, 1)).astype(np.float32))
    return path, feeds


@iree_installed
def test_an_initializer_graph_output_keeps_every_output_under_its_own_name(tmp_path: Path) -> None:
    """A graph output that is an initializer is still a result of the compiled function: leaving it out of the
    output names shifted every later result onto the wrong name (IREE's correct ``y`` was reported as a
    mismatch holding the constant's values, the constant as missing)."""
    const = onnx.numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 8, 1), "c")
    out = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 8, 1]) for name in ("c", "y")]
    model, inputs = _tiny(tmp_path, "const_out", [onnx.helper.make_node("Relu", ["x"], ["r"], name="relu"),
                                                  onnx.helper.make_node("Neg", ["r"], ["y"], name="neg")],
                          out, initializers=(const,))
    assert main(["compare", str(model), "--inputs", str(inputs), "--target", "iree",
                 "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["outcome"]["class"] == "pass"


@iree_installed
def test_an_onnx_op_iree_cannot_convert_is_unsupported_not_a_crash(tmp_path: Path) -> None:
    """An ONNX op the importer has no conversion for stays a generic ``torch.operator`` that iree-compile
    refuses to legalize: IREE lacks the op (a feature request), which compare and reduce say as unsupported."""
    out = [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 2])]
    model, inputs = _tiny(tmp_path, "dft", [onnx.helper.make_node("Relu", ["x"], ["r"], name="relu"),
                                            onnx.helper.make_node("DFT", ["r"], ["y"], name="dft")], out)
    assert main(["compare", str(model), "--inputs", str(inputs), "--target", "iree",
                 "--json", str(tmp_path / "c.json")]) == 1
    outcome = json.loads((tmp_path / "c.json").read_text())["outcome"]
    assert outcome["class"] == "target-unsupported" and 'onnx.DFT' in outcome["detail"]
    bundle = tmp_path / "bundle"
    assert main(["reduce", str(model), "--inputs", str(inputs), "--target", "iree", "-o", str(bundle)]) == 1
    report = json.loads((bundle / "report.json").read_text())
    assert report["signature"]["kind"] == "unsupported"
    assert [node["name"] for node in report["kept_nodes"]] == ["dft"]
    done = subprocess.run([sys.executable, str(bundle / "repro.py")], check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "REPRODUCED" in done.stdout, done.stdout + done.stderr


def _torch_style_attention_block(path: Path) -> Path:
    """A faithful small stand-in of a torch-exported transformer block (issue 26): input [1, 6, 32]; q/k/v
    reshaped to heads through a Shape → Gather → Concat shape, so shape inference with data propagation
    resolves every dim, while the ``value_info`` torch's exporter writes declares them unknown
    (``[?, ?, ?, ?]``)."""
    rng = np.random.default_rng(0)
    helper, nh, f32 = onnx.helper, onnx.numpy_helper, onnx.TensorProto.FLOAT

    def weight(name: str) -> onnx.TensorProto:
        return nh.from_array((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), name)

    ints = {"i0": 0, "i1": 1, "ax0": [0], "heads": [4], "dh": [8], "hid": [32]}
    inits = [*(weight(n) for n in ("wq", "wk", "wv", "wo")),
             *(nh.from_array(np.array(v, np.int64), n) for n, v in ints.items()),
             nh.from_array(np.array(1 / np.sqrt(8), np.float32), "scale")]
    node = helper.make_node
    nodes = [node("MatMul", ["x", f"w{p}"], [p], name=f"{p}_proj") for p in "qkv"] + [
        node("Shape", ["x"], ["xs"], name="shape"),
        node("Gather", ["xs", "i0"], ["b"], axis=0, name="g0"), node("Gather", ["xs", "i1"], ["s"], axis=0, name="g1"),
        node("Unsqueeze", ["b", "ax0"], ["bu"], name="u0"), node("Unsqueeze", ["s", "ax0"], ["su"], name="u1"),
        node("Concat", ["bu", "su", "heads", "dh"], ["shp"], axis=0, name="cat"),
        *(node("Reshape", [p, "shp"], [f"{p}4"], name=f"r{p}") for p in "qkv"),
        node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="tq"),
        node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="tk"),
        node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3], name="tv"),
        node("MatMul", ["qt", "kt"], ["sc"], name="scores"), node("Mul", ["sc", "scale"], ["scs"], name="scale_mul"),
        node("Softmax", ["scs"], ["p"], axis=-1, name="softmax"), node("MatMul", ["p", "vt"], ["ctx"], name="ctx"),
        node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3], name="tc"),
        node("Concat", ["bu", "su", "hid"], ["shp2"], axis=0, name="cat2"),
        node("Reshape", ["ctxt", "shp2"], ["o"], name="ro"), node("MatMul", ["o", "wo"], ["op"], name="o_proj"),
        node("Add", ["op", "x"], ["y"], name="residual")]
    ranks = {"q": 3, "k": 3, "v": 3, "o": 3, "op": 3, **{n: 4 for n in ("q4", "k4", "v4", "qt", "kt", "vt", "sc", "scs",
                                                                      "p", "ctx", "ctxt")}}
    unknown = [helper.make_tensor_value_info(n, f32, [None] * r) for n, r in ranks.items()]
    io = [helper.make_tensor_value_info(n, f32, [1, 6, 32]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "block", io[:1], io[1:], inits, value_info=unknown)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@iree_installed
def test_probe_of_a_torch_exported_block_is_imported_and_compared_layerwise(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26: the probe declares an exposed tensor as the model does (``[?,?,?,?]``) but IREE's import ran
    shape inference with data propagation, which refined the graph output to ``[1,6,4,8]`` and left the node's
    ``value_info``, so MLIR refused ``func.return`` and compare blamed the target for the probe. Every
    intermediate the target keeps must be compared instead."""
    model = _torch_style_attention_block(tmp_path / "block.onnx")
    assert main(["compare", str(model), "--target", "iree", "--json", str(tmp_path / "c.json")]) == 0
    data = json.loads((tmp_path / "c.json").read_text())
    assert "probe" not in (data["layerwise_note"] or ""), data["layerwise_note"]
    observed = {row["tensor"] for row in data["layers"] if row["observed"]}
    assert {"scs", "p", "ctxt"} <= observed, observed  # what the dispatches keep, measured on the target
    assert "failed on the probe" not in capsys.readouterr().out


@iree_installed
def test_an_mlir_verification_failure_says_what_failed(tmp_path: Path) -> None:
    """MLIR's error starts "Verification failed:" and says what failed on the next lines; that first line alone
    was what compare's note showed. The real verifier error of the probe above, imported as it was before the
    fix (graph outputs refined by data propagation, value_info left as declared), must carry its cause."""
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    from graphbisect.backends.base import RunResult, RunStatus
    from graphbisect.backends.iree import import_error

    probe = load_model(_torch_style_attention_block(tmp_path / "block.onnx")).with_outputs(["q4", "p"])
    inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    info = onnx_importer.ModelInfo(inferred)
    module = info.create_module(context=ir.Context()).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    with pytest.raises(Exception) as raised:
        module.verify()
    error = import_error(raised.value)
    shown = RunResult(RunStatus.CRASH, error_type=type(error).__name__, message=str(error)).describe()
    assert "doesn't match function result type !torch.vtensor<[1,6,4,8],f32>" in shown, shown
