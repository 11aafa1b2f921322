"""The public Python API: names and signatures pinned, docs/api.md in sync, and the façade used for real."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import graphbisect
from graphbisect.cli.main import main
from graphbisect.docs.api_doc import RESULTS, documented_names, render
from graphbisect.errors import InputError, ModelError
from graphbisect.examples import example_inputs_path, example_model_path, host_network
from graphbisect.examples.patterns import pattern_model

ROOT = Path(__file__).resolve().parents[1]

#: The public surface. Changing it is an API change: update this table, docs/api.md and the README.
PINNED = {
    "compare": "(model, *, oracle='onnxruntime:opt_level=disable', target='onnxruntime:opt_level=all', inputs=None, "
               "shapes=None, seed=0, atol=0.0001, rtol=0.001, tolerance=None, layerwise=True, all_tensors=False, "
               "workdir=None, check=None, on_stage=None)",
    "audit": "(bundle, *, trust=False)",
    "load_model": "(source)",
    "passes": "(model, *, oracle='onnxruntime:opt_level=disable', target='onnxruntime:opt_level=all', inputs=None, "
              "shapes=None, seed=0, atol=0.0001, rtol=0.001, tolerance=None, strict_band=False, max_invocations=None, "
              "timeout=None, workdir=None, on_stage=None, on_progress=None)",
    "precision": "(model, *, mode='fp16', oracle='onnxruntime:opt_level=disable', target='onnxruntime:opt_level=all', "
                 "inputs=None, shapes=None, seed=0, atol=0.01, rtol=0.01, tolerance=None, sensitivity=False, "
                 "prefix=True, alone=None, calibration='minmax', max_invocations=None, jobs=1, output=None, "
                 "workdir=None, on_stage=None, on_progress=None)",
    "reduce": "(model, output, *, oracle='onnxruntime:opt_level=disable', target='onnxruntime:opt_level=all', "
              "inputs=None, shapes=None, seed=0, atol=0.0001, rtol=0.001, tolerance=None, check=None, fail_code=None, "
              "fail_regex=None, passes=False, strict_band=False, max_invocations=None, deadline=None, jobs=1, "
              "executor=None, timeout=None, layerwise=True, keep_work=False, zip=False, resume=False, "
              "force=False, on_stage=None, on_progress=None)",
    "register_backend": "(runtime, *, name=None, summary=None, capabilities=None, options=None, aliases=(), "
                        "import_name=None, distributions=(), replace=False, inert_options=None)",
    "triage": "(input_dir, output, *, oracle='onnxruntime:opt_level=disable', target='onnxruntime:opt_level=all', "
              "atol=0.0001, rtol=0.001, tolerance=None, passes=True, seed=0, executor='local', jobs=None, "
              "candidate_jobs=1, max_invocations=None, timeout=None, on_model=None, on_stage=None)",
    "unregister_backend": "(name)",
    "verify": "(bundle, *, target=None, trust=False, check=None, model=None, inputs=None)",
    "releases": "(source, *, package, within=None, versions=None, pre=False, target=None, find='bad', cache=None, "
                "jobs=2, repeat=3, trust=False, installer='auto', section=True, "
                "oracle='onnxruntime:opt_level=disable', inputs=None, "
                "seed=0, atol=0.0001, rtol=0.001, failure_bundle=None, workdir=None, on_progress=None)",
    "tactics.record": "(model, *, target=None, inputs=None, shapes=None, seed=0)",
    "tactics.replay": "(model, record, *, target=None, inputs=None, shapes=None, seed=0)",
    "tactics.isolate": "(model, *, good=None, bad=None, builds=0, perturb=(), target=None, oracle=None, atol=None, "
                       "rtol=None, inputs=None, shapes=None, seed=0, max_invocations=None)",
}
ERRORS = ["BackendError", "BackendUnavailableError", "GraphBisectError", "InputError", "ModelError", "OptionError",
          "SpecError"]


def _plain(obj: object) -> str:
    """A signature without annotations: what a caller relies on (names, kinds, defaults)."""
    sig = inspect.signature(obj)  # type: ignore[arg-type]
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=sig.empty))


def test_public_names_are_pinned() -> None:
    assert sorted(graphbisect.__all__) == sorted(
        [*ERRORS, "Runtime", "__version__", *{name.split(".")[0] for name in PINNED}])


@pytest.mark.parametrize("name", sorted(PINNED))
def test_public_signatures_are_pinned(name: str) -> None:
    obj: object = graphbisect
    for part in name.split("."):
        obj = getattr(obj, part)
    assert _plain(obj) == PINNED[name]
    assert inspect.getdoc(obj), f"graphbisect.{name} has no docstring"


def test_errors_are_one_hierarchy() -> None:
    for name in ERRORS:
        assert issubclass(getattr(graphbisect, name), graphbisect.GraphBisectError)


def test_names_survive_importing_the_subpackages_they_share() -> None:
    """``graphbisect.compare`` stays the function after graphbisect.compare.* modules are imported."""
    import graphbisect.compare.metrics
    import graphbisect.precision.lowering
    import graphbisect.releases.search
    import graphbisect.tactics.openvino
    import graphbisect.triage.dedup

    assert callable(graphbisect.compare) and callable(graphbisect.precision) and callable(graphbisect.triage)
    assert callable(graphbisect.releases)
    assert callable(graphbisect.tactics.record)


def test_a_subpackage_imported_first_does_not_take_the_name_of_the_function() -> None:
    """In a fresh interpreter, a module of ``graphbisect.compare`` imported before the API's ``compare`` is first
    used, then ``from graphbisect import ...`` and ``import graphbisect.x as``: each name stays the function."""
    code = textwrap.dedent("""
        import graphbisect.compare.metrics, graphbisect.triage.dedup, graphbisect.releases.search
        import graphbisect
        from graphbisect import precision, GraphBisectError
        import graphbisect.tactics.openvino
        assert callable(graphbisect.compare) and callable(graphbisect.triage) and callable(precision)
        assert callable(graphbisect.releases) and callable(graphbisect.tactics.record)
        assert graphbisect.compare.__module__ == "graphbisect.api" and issubclass(GraphBisectError, Exception)
        assert graphbisect.model.__name__ == "graphbisect.model"  # a subpackage not imported yet, as an attribute
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_importing_the_package_or_a_worker_imports_no_workflow() -> None:
    """``import graphbisect`` (every command's, every worker's and every zygote's first import) imports no module
    of the package but its version; a backend worker's module imports neither onnx nor the host's side of the
    backends nor a workflow (a zygote, and each interpreter a release search starts, pays for what it imports)."""
    code = ("import sys, graphbisect; first = sorted(m for m in sys.modules if m.startswith('graphbisect'))\n"
            "import graphbisect.backends.worker\n"
            "print(first, sorted(m for m in sys.modules if m.startswith(('graphbisect.api', 'graphbisect.workflows',"
            " 'graphbisect.backends.process', 'graphbisect.backends.registry', 'onnx'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.stdout.strip() == "['graphbisect', 'graphbisect._version'] []", done.stderr
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        graphbisect.no_such_name  # noqa: B018


def test_api_page_is_in_sync_with_the_docstrings() -> None:
    page = ROOT / "docs" / "api.md"
    assert page.read_text(encoding="utf-8") == render(), "regenerate it: python -m graphbisect.docs.api_doc"


def test_api_doc_check_flag_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--check`` and ``--help`` are options, not page paths (they once wrote files named "--check" and "--help")."""
    from graphbisect.docs.api_doc import main

    stale = tmp_path / "api.md"
    stale.write_text("old\n", encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert stale.read_text(encoding="utf-8") == "old\n"
    assert "out of date" in capsys.readouterr().err
    assert main([str(stale)]) == 0 and main(["--check", str(stale)]) == 0
    with pytest.raises(SystemExit):
        main(["--help"])
    assert not list(tmp_path.glob("-*")) and not list(ROOT.glob("-*")), "a flag was taken for a file name"


def test_reduce_takes_a_model_proto_and_no_inputs_and_leaves_no_work_folder(tmp_path: Path) -> None:
    """The façade loads what it is given and draws the CLI's seeded inputs; a 1-minimal result cleans up."""
    proto = host_network(100, bug="layernorm_keepdims0", seed=3).model
    result = graphbisect.reduce(proto, tmp_path / "bug")
    assert result.failed and result.one_minimal
    assert result.final_nodes < result.original_nodes
    assert (tmp_path / "bug" / "repro.py").exists()
    assert result.to_json()["kept_nodes"] == list(result.kept_nodes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bug"]


def test_reduce_with_a_python_check(tmp_path: Path) -> None:
    """A callable judges the outputs: here, 'the target's values are within 1e-3 of the oracle's'."""
    calls: list[tuple[str, ...]] = []

    def close_enough(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
        calls.append(tuple(sorted(outputs)))
        return all(np.allclose(outputs[k], expected[k], atol=1e-3) for k in expected)

    result = graphbisect.reduce(pattern_model("layernorm_keepdims0"), tmp_path / "bug", check=close_enough)
    assert result.failed and result.one_minimal
    assert result.signature.detail == "the Python check rejected the outputs"
    assert len(calls) >= result.invocations["target"] - 1  # every target run that completed was judged by it
    assert result.final_nodes < result.original_nodes
    # The check's verdict is the failure: the spec's comparison of values is reported, blaming no side.
    spec = json.loads((tmp_path / "bug" / "report.json").read_text())["spec_check"]
    assert spec["verdict"] == "not-a-value-failure" and "the Python output check" in spec["text"]


def test_a_python_check_bundle_is_never_judged_by_the_tolerance(tmp_path: Path) -> None:
    """The check and the tolerance disagree: ONNX Runtime computes the keepdims=1 LayerNorm correctly (within
    tolerance), and the check rejects any negative output. repro.py and `graphbisect verify` judged the bundle
    by the tolerance and said FIXED (exit 0) on the very model the check had just rejected; repro_min.py's
    assertion printed "the bug is fixed". Now a completed run is UNDECIDED (exit 2) unless the check is given."""
    def non_negative(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
        return all(bool((value >= 0).all()) for value in outputs.values())

    result = graphbisect.reduce(pattern_model("layernorm_keepdims1"), tmp_path / "bug", check=non_negative)
    assert result.failed and result.signature.detail == "the Python check rejected the outputs"
    bundle = tmp_path / "bug"
    repro = subprocess.run([sys.executable, str(bundle / "repro.py")], capture_output=True, text=True, check=False)
    assert repro.returncode == 2 and "UNDECIDED" in repro.stdout, repro.stdout + repro.stderr
    assert "FIXED" not in repro.stdout and "REPRODUCED" not in repro.stdout
    assert "  ok " in repro.stdout  # the tolerance accepts the outputs: only the check rejects them
    undecided = graphbisect.verify(bundle)
    assert undecided.outcome == "undecided" and undecided.observed.kind.value == "none"
    assert main(["verify", str(bundle)]) == 2
    assert graphbisect.verify(bundle, check=non_negative).outcome == "reproduces"
    # a check's verdict on a part of the model is its kind, not where it goes wrong: fixed there, not shown here
    assert graphbisect.verify(bundle, check=lambda outputs, expected: True).outcome == "fixed-reduced"
    assert "UNDECIDED (exit 2)" in (bundle / "report.md").read_text()
    assert not (bundle / "repro_min.py").exists()  # its tolerance assertion printed "the bug is fixed"


def test_a_check_that_raises_names_itself(tmp_path: Path) -> None:
    def broken(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
        return bool(outputs["logits"].argmax())  # the model has no output 'logits'

    with pytest.raises(InputError, match="broken raised KeyError") as info:
        graphbisect.reduce(pattern_model("layernorm_keepdims0"), tmp_path / "bug", check=broken)
    assert isinstance(info.value.__cause__, KeyError)
    assert not (tmp_path / "bug.work").exists()  # nothing to resume: no work folder left behind


def test_reduce_of_a_missing_file_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"nope\.onnx"):
        graphbisect.reduce(tmp_path / "nope.onnx", tmp_path / "bug")


# ------------------------------------------------------------------------ results: every JSON field an attribute


def _json_keys(cls: type) -> set[str]:
    """The top-level keys ``cls.to_json`` writes, read from its source: the returned dict literal's string keys,
    ``data["key"] = ...`` assignments and, for ``dataclasses.asdict(self)``, the dataclass fields."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.to_json)))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Assign) and isinstance(target := node.targets[0], ast.Subscript) \
                and isinstance(target.slice, ast.Constant):
            keys.add(target.slice.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "asdict":
            keys |= {field.name for field in dataclasses.fields(cls)}
    return keys


def _typed_attribute(cls: type, name: str) -> str | None:
    """The attribute's declared type (a dataclass field's, a property's return annotation), or None."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    if name in fields:
        return str(fields[name].type)
    found = inspect.getattr_static(cls, name, None)
    if isinstance(found, property) and found.fget is not None:
        annotation = inspect.signature(found.fget).return_annotation
        return None if annotation is inspect.Signature.empty else str(annotation)
    return None


@pytest.mark.parametrize(("module", "name"), RESULTS, ids=[name for _, name in RESULTS])
def test_every_json_field_of_a_result_is_a_typed_attribute(module: str, name: str) -> None:
    """`graphbisect.compare(...)` had no `verdict`, `first_divergence`, `root_causes`, `layers`, `outputs` or
    `compiled_graph`, although its JSON has them and the façade promised the JSON fields as attributes."""
    cls = getattr(importlib.import_module(module), name)
    keys = _json_keys(cls)
    assert keys, f"{name}.to_json's keys could not be read"
    untyped = sorted(key for key in keys if _typed_attribute(cls, key) is None)
    assert not untyped, f"{name}: JSON fields without a typed attribute: {untyped}"


def test_compare_results_attributes_are_its_json(tmp_path: Path) -> None:
    result = graphbisect.compare(example_model_path(), inputs=example_inputs_path())
    data = result.to_json()
    assert result.verdict == data["verdict"] == "fail"
    assert result.first_divergence is not None and result.first_divergence.node == data["first_divergence"]["node"]
    assert [c.to_json() for c in result.root_causes] == data["root_causes"]
    assert [row.to_json() for row in result.layers] == data["layers"]
    assert [s.to_json() for s in result.outputs] == data["outputs"]
    assert result.compiled_graph is not None and data["compiled_graph"]["source"] == result.compiled_graph.source
    assert result.target_status == data["target_status"] == "ok" and result.judged_by == "tolerance"


def test_compare_takes_a_python_check_like_reduce() -> None:
    """The check decides the verdict (here: accept anything within 1.0); the table stays the tolerance's view."""
    calls: list[tuple[str, ...]] = []

    def loose(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
        calls.append(tuple(sorted(outputs)))
        return all(np.allclose(outputs[k], expected[k], atol=1.0) for k in expected)

    result = graphbisect.compare(example_model_path(), inputs=example_inputs_path(), check=loose)
    assert calls == [("y",)] and result.passed and result.check_passed is True
    assert result.verdict == "pass" and result.judged_by == "python-check"
    assert result.comparison is not None and not result.comparison.passed  # the tolerance's view is kept
    assert "the Python check accepted the outputs" in str(result.outcome)
    strict = graphbisect.compare(example_model_path(), inputs=example_inputs_path(), check=lambda o, e: False)
    assert not strict.passed and strict.check_passed is False and strict.outcome.detail.startswith("the Python check")


def test_the_api_page_documents_every_public_type_and_each_documented_name_exists() -> None:
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = documented_names(page)
    for module, name in documented:
        assert hasattr(importlib.import_module(module), name), f"docs/api.md documents {module}.{name}: it is gone"
    names = {name for _, name in documented}
    assert {"Comparison", "TensorStats", "LayerwiseReport", "LayerRow", "RootCause", "Outcome", "Signature",
            "RunResult", "CompiledGraph", "NoiseFloor", "ChosenDim", "AloneCheck"} <= names
    runtime = page.split("## `graphbisect.Runtime`")[1].split("\n## ")[0]
    assert "`__init__(self, options: Mapping[str, str], workdir: str) -> None`" in runtime
    assert "`run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]`" in runtime
    check = page.split("### `OutputCheck`")[1].split("\n## ")[0]
    assert "Mapping[str, \"np.ndarray\"]" in check and "``outputs``: the target's values" in check
    assert "### `graphbisect.examples.example_model_path`" in page and "example_model_path(\n) -> Path" in page


def test_every_type_a_public_signature_names_is_documented() -> None:
    """`ProgressEvent` (on_progress), `Capability`, `Rule` and `BackendInfo` (register_backend) appeared in the
    page's signatures and nowhere else on it: a custom backend's author could not learn what they are."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    signatures = "".join(re.findall(r"```python\n(.*?)```", page.split("## Result types")[0], re.S))
    named = set(re.findall(r"\b[A-Z]\w*", signatures)) - {"Callable", "Iterable", "Mapping", "Sequence", "PathLike",
                                                          "None", "True", "False"}
    documented = {name for _, name in documented_names(page)} | set(re.findall(r"^### `(\w+)`$", page, re.M))
    assert {"ProgressEvent", "Capability", "Rule", "BackendInfo"} <= named
    assert named <= documented, sorted(named - documented)


def test_each_capability_says_what_it_promises_and_enables() -> None:
    """The capability strings a Runtime may declare were not listed anywhere a custom backend's author reads."""
    from graphbisect.backends import Capability

    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = page.split("### `Capability` (graphbisect.backends.base)")[1].split("\n### ")[0]
    for capability in Capability:
        assert f"* ``{capability.value}`` — " in section, capability
    assert "what keeps a reduction" in section and "compiled_option" in section


class DescribingRuntime:
    """A runtime that saves the optimized model it ran (its class attributes are what the test reads)."""

    capabilities = ("onnx-input", "compiled-graph")
    options: ClassVar[dict[str, str]] = {"save_optimized": "1: report the optimized model's path (run info "
                                                           "optimized_model)"}
    compiled_option = ("save_optimized", "1")


class SilentRuntime:
    """A runtime that says it describes its compiled graph, and not how to ask it."""

    capabilities = ("onnx-input", "compiled-graph")


def test_a_custom_backend_declaring_compiled_graph_names_its_option() -> None:
    """compiled-graph on a registered class was kept, but the option that asks a run to describe its compiled
    graph could not be given: nothing was described, and nothing said so."""
    from graphbisect.backends.base import Capability
    from graphbisect.errors import SpecError

    info = graphbisect.register_backend(DescribingRuntime, name="describes")
    try:
        assert info.has(Capability.COMPILED_GRAPH) and info.compiled_option == ("save_optimized", "1")
    finally:
        graphbisect.unregister_backend("describes")
    with pytest.raises(SpecError, match="declares compiled-graph without a compiled_option") as caught:
        graphbisect.register_backend(SilentRuntime, name="silent")
    assert caught.value.hint is not None and "compiled_option = (OPTION, VALUE)" in caught.value.hint


def test_compare_starts_its_workers_zygote_before_it_loads_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygote's imports (numpy, graphbisect: ~0.16 s of CPU) overlap loading and checking the model, as in
    # `graphbisect compare`, instead of holding up the first worker after them.
    from graphbisect.backends import process
    from graphbisect.model import load as model_load

    events: list[str] = []
    real_prestart, real_load = process.prestart, model_load.load_model
    monkeypatch.setattr(process, "prestart", lambda spec: (events.append(f"prestart {spec}"), real_prestart(spec)))
    monkeypatch.setattr(model_load, "load_model",
                        lambda *args, **kwargs: (events.append("load"), real_load(*args, **kwargs))[1])
    monkeypatch.setattr("graphbisect.model.load_model", model_load.load_model)
    result = graphbisect.compare(pattern_model("layernorm_keepdims0"), layerwise=False)
    assert not result.passed
    assert events.index("prestart onnxruntime:opt_level=all") < events.index("load")
    assert events.index("prestart onnxruntime:opt_level=disable") < events.index("load")
