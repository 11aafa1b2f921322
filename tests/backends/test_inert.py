"""The trust rule (issue 24): which options of a recorded spec are inert, by an allow-list.

The numbered cases of the issue (a bundle running code through ``verify`` and ``repro.py``) are in
``tests/artifacts/test_artifacts_trust.py``; these tests hold the rule itself: aliases are resolved, every
built-in option is classified, unknown options and keys are not inert, and ``repro.py`` applies the same
rules with the same function.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from typing import Any, ClassVar

import pytest

from graphbisect.artifacts.repro import _trust_section, repro_options
from graphbisect.artifacts.repro_backends import REPRO_BACKENDS
from graphbisect.backends import BACKENDS, BackendSpec, get
from graphbisect.backends.inert import ANY, IREE_FLAGS, ORT_SESSION_CONFIG, untrusted_values
from graphbisect.backends.iree import FEATURES, IreeOptions
from graphbisect.backends.registry import (
    DEFAULT_ORACLE,
    DEFAULT_TARGET,
    HOST_OPTIONS,
    register_backend,
    unregister_backend,
    untrusted_options,
)
from graphbisect.errors import SpecError


def _flagged(spec: str, *own_files: str) -> list[str]:
    return [u.describe() for u in untrusted_options(spec, own_files=own_files)]


@pytest.mark.parametrize("name", ["command", "cmd", "CMD", " Command "])
def test_a_command_needs_trust_under_every_alias(name: str) -> None:
    assert _flagged(f"{name}:cmd=./check.sh {{model}} {{inputs}}") == [
        "cmd=./check.sh {model} {inputs}: is the program the backend runs"]


@pytest.mark.parametrize("spec", [
    DEFAULT_TARGET, DEFAULT_ORACLE, "ort", "ort:opt_level=basic,threads=2,disabled=LayerNormFusionL1;GeluFusionL1",
    "ort:config=session.disable_prepacking=1", "ort:config=optimization.enable_cast_chain_elimination=1",
    "ort:providers=CUDAExecutionProvider,cuda.use_tf32=0,cuda.device_id=1", "ort:save_optimized=1,report_passes=1",
    "ort:timeout=30", "reference", "ref", "onnxoptimizer:passes=fuse_pad_into_pool,threads=1",
    "openvino:precision=bf16,keep_fp32=a;b,report_exec=1,report_tactics=1,device=GPU.1",
    "openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0;EXECUTION_MODE_HINT=ACCURACY;NUM_STREAMS=1;KV_CACHE_PRECISION=f16",
    "tensorrt:fp16=1,shapes=x:1x3x224x224,workspace=1024,device=1,report_layers=1",
    "iree", "iree:cpu=generic,opset=17,device=local-sync,disabled=const-eval;ukernels,report_passes=1",
    "iree:flags=--iree-opt-level=O0;--iree-opt-data-tiling=false;-iree-llvmcpu-target-cpu=generic",
    "paddle:device=gpu:0,precision=bf16,keep_fp32=fused_conv2d,delete_pass=a;b,mkldnn=0",
])
def test_honest_specs_are_inert(spec: str) -> None:
    assert _flagged(spec) == []


@pytest.mark.parametrize("spec, flagged", [
    ("ort:python=/opt/other/bin/python", "python=/opt/other/bin/python: is the Python interpreter"),
    ("ort:config=session.collect_node_memory_stats_to_file=/x", "config=session.collect_node_memory_stats_to_file=/x"),
    ("ort:config=session.disable_prepacking=1;ep.context_file_path=/x", "config=ep.context_file_path=/x"),
    ("ort:config=session.debug_layout_transformation=1", "config=session.debug_layout_transformation=1"),
    ("ort:config=session.node_partition_config_file=/x", "config=session.node_partition_config_file=/x"),
    ("ort:config=session.optimized_model_external_initializers_file_name=x",
     "config=session.optimized_model_external_initializers_file_name=x"),
    ("ort:config=brand.new_key=1", "config=brand.new_key=1"),  # not known: not inert
    ("ort:trt.engine_cache_path=/x", "trt.engine_cache_path=/x: is not an option known to be inert"),
    ("ort:cuda.gpu_external_alloc=0x1234", "cuda.gpu_external_alloc=0x1234"),
    ("iree:flags=--iree-llvmcpu-embedded-linker-path=/x", "flags=--iree-llvmcpu-embedded-linker-path=/x"),
    ("iree:flags=--iree-hal-dump-executable-files-to=/d", "flags=--iree-hal-dump-executable-files-to=/d"),
    ("iree:flags=-iree-hal-dump-executable-sources-to=/d", "flags=-iree-hal-dump-executable-sources-to=/d"),
    ("iree:flags=--mlir-print-ir-tree-dir=/d", "flags=--mlir-print-ir-tree-dir=/d"),
    ("iree:flags=-o=/tmp/x.vmfb", "flags=-o=/tmp/x.vmfb"),
    ("iree:flags=--iree-opt-level=O0;@/tmp/response", "flags=@/tmp/response: is not a flag"),
    ("openvino:keep_fp32=@/home/me/pins.txt", "keep_fp32=@/home/me/pins.txt: names a file to read"),
    ("paddle:keep_fp32=@/home/me/types.txt", "keep_fp32=@/home/me/types.txt: names a file to read"),
    ("openvino:tactics=/home/me/record.json", "tactics=/home/me/record.json: names a file outside the bundle"),
    ("openvino:config=CACHE_DIR=/home/me/cache", "config=CACHE_DIR=/home/me/cache: is not an OpenVINO property"),
    ("openvino:config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0;WEIGHTS_PATH=/x", "config=WEIGHTS_PATH=/x"),
    ("openvino:config=BRAND_NEW_PROPERTY=1", "config=BRAND_NEW_PROPERTY=1"),  # not known: not inert
    ("reference:anything=1", "anything=1: is not an option known to be inert"),
])
def test_what_is_not_known_to_be_inert_needs_trust(spec: str, flagged: str) -> None:
    found = _flagged(spec)
    assert len(found) == 1 and found[0].startswith(flagged), found


def test_the_refusal_names_each_entry_that_is_not_inert_and_only_those() -> None:
    spec = ("iree:flags=--iree-opt-level=O0;--iree-hal-dump-executable-files-to=/d;"
            "--iree-llvmcpu-embedded-linker-path=/p")
    assert [u.value for u in untrusted_options(spec)] == ["--iree-hal-dump-executable-files-to=/d",
                                                         "--iree-llvmcpu-embedded-linker-path=/p"]


def test_the_bundles_own_tactic_record_is_inert() -> None:
    assert _flagged("openvino:tactics=/tmp/b/tactics.json", "/tmp/b/tactics.json") == []
    assert _flagged("openvino:tactics=/tmp/elsewhere.json", "/tmp/b/tactics.json")


def test_every_built_in_option_is_classified() -> None:
    """A new option gets a rule when it is added (else it needs --trust, which is safe but surprising)."""
    for row in BACKENDS:
        assert set(row.options) <= set(row.inert_options), (row.name, set(row.options) - set(row.inert_options))
    assert set(HOST_OPTIONS) == {"python", "timeout"}  # HOST_INERT classifies both


def test_every_iree_feature_flag_is_inert() -> None:
    """``disabled=`` turns into these flags, which repro.py's settings hold as flags."""
    names = {flag.lstrip("-").partition("=")[0] for flag in FEATURES.values()}
    assert names <= set(IREE_FLAGS["flags"])
    every = IreeOptions.parse({"disabled": ";".join(FEATURES)}).to_json()
    assert untrusted_values(REPRO_BACKENDS["iree"].inert, every) == []


class Custom:
    """A custom runtime (never run here: only its row matters)."""

    options: ClassVar[dict[str, str]] = {"level": "an optimization level", "dump": "a folder to dump into"}


def test_a_custom_backend_gets_no_allow_list_unless_it_declares_one() -> None:
    register_backend(Custom, name="trust-custom")
    register_backend(Custom, name="trust-declared", aliases=("trust-alias",), inert_options={"level": ANY})
    try:
        assert _flagged("trust-custom") == []  # no option set: only the user's own installed code runs
        assert _flagged("trust-custom:level=3") == ["level=3: is not an option known to be inert: it may run a "
                                                    "program, load a library or write a file"]
        assert _flagged("trust-alias:level=3,timeout=9") == []
        assert [u.option for u in untrusted_options("trust-alias:level=3,dump=/x,python=/p")] == ["dump", "python"]
        with pytest.raises(SpecError, match="unknown backend"):
            untrusted_options("trust-nonexistent:level=1")
    finally:
        unregister_backend("trust-custom")
        unregister_backend("trust-declared")


# --- repro.py: the same rules, the same function ----------------------------------------------------------
def test_repro_py_checks_the_settings_of_the_same_rules() -> None:
    assert REPRO_BACKENDS["onnxruntime"].inert["session_config"] is get("ort").inert_options["config"]
    assert REPRO_BACKENDS["onnxruntime"].inert["session_config"] is ORT_SESSION_CONFIG
    assert REPRO_BACKENDS["iree"].inert["flags"] is get("iree").inert_options["flags"]
    assert REPRO_BACKENDS["command"].inert["cmd"] is get("cmd").inert_options["cmd"]


@pytest.mark.parametrize("name", sorted(REPRO_BACKENDS))
def test_repro_py_has_a_rule_for_every_setting_it_applies(name: str) -> None:
    backend = REPRO_BACKENDS[name]
    settings = backend.options({})
    assert set(settings) <= set(backend.inert)
    expected = [("cmd", "", "is the program the backend runs")] if name == "command" else []
    assert untrusted_values(backend.inert, json.loads(json.dumps(settings))) == expected


@pytest.mark.parametrize("spec", [
    "ort:opt_level=basic,config=session.disable_prepacking=1", "onnxoptimizer:passes=fuse_pad_into_pool",
    "iree:cpu=generic,flags=--iree-opt-level=O0,disabled=data-tiling", "openvino:precision=bf16,threads=2",
    "tensorrt:fp16=1,shapes=x:1x3",
])
def test_repro_py_settings_of_honest_specs_are_inert(spec: str) -> None:
    parsed = BackendSpec.parse(spec)
    settings = json.loads(json.dumps(repro_options(parsed)))  # as repro_config.json holds them
    assert untrusted_values(REPRO_BACKENDS[get(parsed.name).name].inert, settings) == []


def test_the_function_repro_py_carries_is_self_contained() -> None:
    """repro.py embeds the source of untrusted_values: compiled alone (json only), it decides the same."""
    namespace: dict[str, Any] = {"json": json}
    source = "from __future__ import annotations\n" + textwrap.dedent(inspect.getsource(untrusted_values))
    exec(compile(source, "repro.py", "exec"), namespace)  # our own source, as repro.py runs it
    standalone = namespace["untrusted_values"]
    rules = {**get("ort").inert_options, "nested": {"options": REPRO_BACKENDS["iree"].inert},
             "file": "bundle-file", "names": "names", "cmd": {"never": "runs"}}
    cases: list[Any] = [
        {"config": "session.disable_prepacking=1;x.y=2", "opt_level": "all", "unknown": None},
        {"config": [["session.intra_op.allow_spinning", "0"], ["ep.context_enable", "1"], "bad", [1, 2]]},
        {"nested": {"flags": ["--iree-opt-level=O0", "--x", 3, "y"], "cpu": "host", "other": 1}},
        {"nested": ["not", "a", "mapping"], "file": "tactics.json", "names": "@/x", "cmd": "run"},
        {"file": "/elsewhere", "names": ["a", "b"], "config": {"a": 1}}, ["not", "options"], None,
    ]
    for options in cases:
        assert standalone(rules, options, ("tactics.json",)) == untrusted_values(rules, options, ("tactics.json",))
    assert untrusted_values(rules, cases[0]) and untrusted_values(rules, cases[2])


def test_the_rendered_script_carries_the_rule() -> None:
    for backend in REPRO_BACKENDS.values():
        section = _trust_section(backend)
        assert inspect.getsource(untrusted_values) in section
        namespace: dict[str, Any] = {"json": json}
        exec(compile("from __future__ import annotations\nclass CannotRun(Exception): pass\n" + section,
                     "repro.py", "exec"), namespace)
        assert namespace["INERT_OPTIONS"] == json.loads(json.dumps(backend.inert))
