"""IREE as a backend: an ML *compiler* (ONNX import → ``iree-compile`` for ``llvm-cpu`` → ``iree.runtime``).

Runs inside a worker process; imports only the standard library and numpy at module level, and
``onnx``, ``iree.compiler`` and ``iree.runtime`` lazily.

**Pipeline.** :func:`import_onnx` does what ``python -m iree.compiler.tools.import_onnx`` does (load with
external data, optional opset upgrade, ONNX shape inference with data propagation, the torch-onnx importer)
but keeps the MLIR's debug locations, which carry the ONNX node names; :func:`compile_command` builds the
``iree-compile`` line (``--iree-hal-target-backends=llvm-cpu``, the target CPU, the ablated features, the
user's flags) that :func:`compile_vmfb` runs as a child process; :func:`load_module` and
:func:`run_module` run the entry function, which the importer names after the ONNX graph.

**Failures are results with a stable signature.** An import failure raises :class:`IreeImportError`, a
compile failure :class:`IreeCompileError`; both become *crash at load* results, except an ONNX op the
importer has no conversion for: it stays a generic ``torch.operator`` that ``iree-compile`` refuses to
legalize, which :data:`~graphbisect.oracle.outcome.UNSUPPORTED_PATTERN` classifies as *unsupported* (a feature
IREE lacks, not a compiler bug). The message's first
paragraph (what signatures key on) is :func:`compile_diagnostic`'s stable part of the compiler's output:
the first ``error:`` with its location prefix, ``loc(...)`` attributes, SSA names and operand lists removed
but the failing op, its ONNX op name (``<{name = "onnx.DFT"}>``) and types kept; for a compiler that
crashed (``Stack dump:``), the signal, the assertion when there is one, and the innermost compiler frames.
So ``reduce`` shrinks a model that makes the compiler fail without drifting to another diagnostic. The full
compiler output follows after a blank line.

**Intermediates** are added on the ONNX side (graph outputs, typed by shape inference), as for ONNX
Runtime. **Dispatches** (``report_dispatches=1``): the compile also dumps the executable sources
(``--iree-hal-dump-executable-sources-to``) and ``info()["dispatches"]`` maps each dispatch to the ONNX nodes
whose locations it contains (see :func:`dispatch_nodes`), so a wrong dispatch maps back to original nodes.

**Features** (:data:`FEATURES`) are the compiler's optimizations that ``passes`` ablates: each name stands for
the flag that switches it off (``const-eval`` → ``--iree-opt-const-eval=false``). ``disabled=A;B`` adds
those flags; ``report_passes=1`` compiles once more per feature that is still enabled and reports in
``fired_passes`` the features whose flag changes the compiled module (the ``.vmfb`` bytes): the ones that
changed *this* program. That listing is 2 + one compile per feature, more than a search over every feature
costs, so ``passes`` never asks for it (:attr:`graphbisect.strategies.passes.PassControl.listing_builds`);
a bundle's report facts (what fired at the lowest failing
level) and ``releases`` do. One compile reporting which
MLIR passes changed the IR (``--mlir-print-ir-after-change``) would not replace it: most features are options of
passes that run either way (fusion heuristics, LLVM's vectorizers, the ukernel choice), so a pass that changed
the IR does not say which flag changed the module.

The functions marked *repro* below are self-contained (stdlib, numpy, the IREE packages, onnx): the bundle's
``repro.py`` embeds their source, so the standalone script runs exactly this pipeline.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.worker import option_flag, option_int, select_feeds
from graphbisect.errors import SpecError

__all__ = ["CACHE_ENV", "FEATURES", "CompileCache", "Iree", "IreeCompileError", "IreeImportError", "IreeOptions",
           "compile_command", "compile_diagnostic", "dispatch_nodes", "dispatch_types", "feature_flags", "import_error",
           "import_onnx",
           "load_module", "run_module"]

logger = logging.getLogger(__name__)

_OPTIONS = ("cpu", "flags", "opset", "device", "disabled", "report_passes", "report_dispatches")

#: Compiler features ``passes`` can ablate: name -> the flag that switches it off (from IREE 3.13's
#: ``iree-compile --help-hidden``). A flag whose feature is already off changes nothing, so it never fires.
FEATURES: Mapping[str, str] = {
    "const-eval": "--iree-opt-const-eval=false",
    "const-expr-hoisting": "--iree-opt-const-expr-hoisting=false",
    "data-tiling": "--iree-opt-data-tiling=false",
    "aggressive-fusion": "--iree-dispatch-creation-enable-aggressive-fusion=false",
    "fuse-multi-use": "--iree-dispatch-creation-fuse-multi-use=false",
    "propagate-transposes": "--iree-global-opt-propagate-transposes=false",
    "pad-handling": "--iree-flow-enable-pad-handling=false",
    "demote-f64-to-f32": "--iree-input-demote-f64-to-f32=false",
    "ukernels": "--iree-llvmcpu-enable-ukernels=none",
    "loop-vectorization": "--iree-llvmcpu-loop-vectorization=false",
    "slp-vectorization": "--iree-llvmcpu-slp-vectorization=false",
    "vector-peeling": "--iree-llvmcpu-disable-vector-peeling=true",
    "reassociate-fp-reductions": "--iree-llvmcpu-reassociate-fp-reductions=false",
    "fast-min-max": "--iree-llvmcpu-use-fast-min-max-ops=false",
}


def feature_flags(names: Sequence[str]) -> str:
    """The ``iree-compile`` flags that switch ``names`` off: the workaround line for a user outside graphbisect.

    Example:
        >>> feature_flags(["demote-f64-to-f32"])
        '--iree-input-demote-f64-to-f32=false'
    """
    return " ".join(FEATURES[name] for name in names)


def _split(text: str) -> list[str]:
    return list(dict.fromkeys(part.strip() for part in text.split(";") if part.strip()))


@dataclass(frozen=True)
class IreeOptions:
    """The runtime options of an ``iree`` spec, parsed and checked without importing IREE.

    Example:
        >>> o = IreeOptions.parse({"cpu": "generic", "flags": "--iree-opt-level=O0", "disabled": "const-eval"})
        >>> o.compile_flags()
        ['--iree-opt-const-eval=false', '--iree-opt-level=O0']
    """

    cpu: str = "host"
    flags: tuple[str, ...] = ()
    opset: int | None = None
    device: str = "local-task"
    disabled: tuple[str, ...] = ()
    report_passes: bool = False
    report_dispatches: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> IreeOptions:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(f"iree backend has no option {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}")
        flags = _split(options.get("flags", ""))
        bad = [flag for flag in flags if not flag.startswith("-")]
        if bad:
            raise SpecError(f"iree option flags= holds {bad[0]!r}, which is not a compiler flag",
                            hint="write flags=--iree-opt-level=O0;--iree-opt-const-eval=false (';'-separated)")
        disabled = _split(options.get("disabled", ""))
        unknown_features = [name for name in disabled if name not in FEATURES]
        if unknown_features:
            raise SpecError(f"iree has no feature {', '.join(map(repr, unknown_features))} to disable",
                            hint=f"valid: {', '.join(FEATURES)}")
        device = options.get("device", "local-task").strip() or "local-task"
        if device not in ("local-task", "local-sync"):
            raise SpecError(f"iree option device={device!r} is not a CPU device",
                            hint="device=local-task (multi-threaded, default) or device=local-sync")
        return cls(cpu=options.get("cpu", "host").strip() or "host", flags=tuple(flags),
                   opset=option_int(options, "opset", 1), device=device, disabled=tuple(disabled),
                   report_passes=option_flag(options, "report_passes"),
                   report_dispatches=option_flag(options, "report_dispatches"))

    def compile_flags(self, extra_disabled: Sequence[str] = ()) -> list[str]:
        """The feature flags of ``disabled`` (plus ``extra_disabled``), then the user's own flags."""
        names = list(dict.fromkeys([*self.disabled, *extra_disabled]))
        return [FEATURES[name] for name in names] + list(self.flags)

    def to_json(self) -> dict[str, Any]:
        """The settings ``repro.py`` applies (the feature names already turned into flags)."""
        return {"cpu": self.cpu, "flags": self.compile_flags(), "opset": self.opset, "device": self.device}


# --------------------------------------------------------------------------- the pipeline (repro)
class IreeImportError(Exception):
    """The ONNX model could not be imported into MLIR (first paragraph: the importer's error, stable part)."""


_UNCONVERTED_OP = re.compile(r'"torch\.operator"[^\n]*?<\{name = "onnx\.(?P<op>\w+)"\}>')


def newer_opset_hint(model_path: str | Path, message: str, opset: int | None) -> str | None:
    """For a compile that failed on an ONNX op the importer left unconverted: the ``opset=`` that upgrades the
    model to that op's latest version, when the model imports an older one (None otherwise). IREE's importer
    converts some ops only in their newer form: an opset-12 ``Softmax`` is refused, ``iree:opset=13`` runs it.

    Example:
        >>> newer_opset_hint("sm12.onnx", '"torch.operator" <{name = "onnx.Softmax"}>', None)  # doctest: +SKIP
        "IREE's importer may convert onnx.Softmax in its latest form, from opset 13 (the model imports opset 12): \
try iree:opset=13"
    """
    found = _UNCONVERTED_OP.search(message)
    if found is None:
        return None
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    imported = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    current = max(opset or 0, imported or 0)
    try:
        latest = onnx.defs.get_schema(found["op"], onnx.defs.onnx_opset_version(), "").since_version
        used = onnx.defs.get_schema(found["op"], current, "").since_version
    except onnx.defs.SchemaError:
        return None
    if latest <= used:
        return None
    return (f"IREE's importer may convert onnx.{found['op']} in its latest form, from opset {latest} (the model "
            f"imports opset {current}): try iree:opset={latest}")


class IreeCompileError(Exception):
    """``iree-compile`` failed (first paragraph: the stable part of its diagnostic; then the full output).
    ``hint``: what would compile it, where graphbisect knows (:func:`newer_opset_hint`); the crash's
    ``info["error_hint"]``."""

    hint: str | None = None


def import_onnx(model_path: Path | str, mlir_path: Path | str, outputs: list | None = None,
                opset: int | None = None) -> tuple[str, list, list]:
    """Import an ONNX file into torch-dialect MLIR (with ONNX node names as locations), like
    ``iree-import-onnx``; returns the entry function name and the (name, ONNX dtype) of its inputs and outputs.
    ``outputs`` (tensor names) replace the graph's outputs, typed from shape inference."""
    import onnx

    try:
        from iree.compiler import ir
        from iree.compiler.extras import onnx_importer
    except ImportError as exc:
        raise ImportError(f"{exc}; pip install iree-base-compiler onnx") from exc
    try:
        model = onnx.load(str(model_path))  # external data resolves against the model's folder
        current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if opset and current is not None and opset > current:
            model = onnx.version_converter.convert_version(model, int(opset))
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        _declare_outputs_as_value_info(model.graph)
        if outputs is not None:
            graph = model.graph
            typed = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
            for init in graph.initializer:
                typed.setdefault(init.name, onnx.helper.make_tensor_value_info(
                    init.name, init.data_type, list(init.dims)))
            chosen = [typed.get(name) or onnx.helper.make_empty_tensor_value_info(name) for name in outputs]
            del graph.output[:]
            graph.output.extend(chosen)
        info = onnx_importer.ModelInfo(model)
        context = ir.Context()
        module = info.create_module(context=context).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
        text = module.get_asm(enable_debug_info=True)
    except Exception as exc:
        raise import_error(exc) from exc
    Path(mlir_path).write_text(text, encoding="utf-8")
    initializers = {init.name for init in model.graph.initializer}

    def typed_names(values: list, skip: set) -> list:
        return [(v.name, v.type.tensor_type.elem_type) for v in values if v.name not in skip]

    # An initializer listed as a graph input is a constant, not an argument; one listed as a graph output is
    # still a result of the function, so outputs skip nothing (skipping it would shift every later result
    # onto the wrong name).
    return model.graph.name, typed_names(model.graph.input, initializers), typed_names(model.graph.output, set())


def _declare_outputs_as_value_info(graph: Any) -> None:
    """Give each graph output that also has a ``value_info`` entry that entry's type.

    The importer types a node's result from ``value_info`` and the function's result from ``graph.output``;
    shape inference with data propagation refines an output's unknown dims (a probe's exposed ``q4``,
    declared ``[?,?,?,?]`` as the model declares it, becomes ``[1,6,4,8]``) but leaves the ``value_info``
    the model declared (torch's exporter writes ``[?,?,?,?]``), so ``func.return`` failed verification
    ("type of return operand 1 ... doesn't match function result type"): issue 26. The model's own
    declaration wins, as the plain model's nodes are typed by it.
    """
    declared = {v.name: v for v in graph.value_info if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    for output in graph.output:
        found = declared.get(output.name)
        if found is not None:
            output.type.CopyFrom(found.type)


def import_error(exc: BaseException) -> IreeImportError:
    """The :class:`IreeImportError` for an exception of the importer or of MLIR's verifier.

    Its first paragraph (what signatures key on and what one-line descriptions show) is the exception's
    first line with MLIR's ``error:`` lines after it, SSA names removed: MLIR's own first line is only
    "Verification failed:", which told nobody what failed. The other lines (MLIR's ``note:`` with the
    failing operation) follow after a blank line.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    head, rest = lines[:1], lines[1:]
    errors = [line for line in rest if line.startswith("error:")]
    # MLIR quotes types as ('!torch.vtensor<[?,?],f32>'), which one-line causes collapse as a list of names
    first = " ".join(re.sub(r"\('([^']*)'\)", r"\1", re.sub(r"%[\w.$#-]+", "%", line)) for line in [*head, *errors])
    others = [line for line in rest if line not in errors]
    return IreeImportError("\n\n".join([f"{type(exc).__name__}: {first}", "\n".join(others)]).strip())


def compile_command(mlir_path: Path | str, vmfb_path: Path | str, cpu: str = "host", flags: list | tuple = (),
                    dump_dir: Path | str | None = None) -> list:
    """The ``iree-compile`` command line for the llvm-cpu target (the binaries of iree-base-compiler)."""
    from iree.compiler.tools.binaries import find_tool

    command = [find_tool("iree-compile"), str(mlir_path), "--iree-input-type=auto",
               "--iree-hal-target-backends=llvm-cpu", f"--iree-llvmcpu-embedded-linker-path={find_tool('iree-lld')}",
               f"--iree-llvmcpu-target-cpu={cpu}", "--mlir-print-op-on-diagnostic=false", "-o", str(vmfb_path)]
    if dump_dir is not None:
        command += [f"--iree-hal-dump-executable-sources-to={dump_dir}", "--mlir-print-debuginfo"]
    return command + list(flags)


def compile_diagnostic(output: str, returncode: int) -> str:
    """The stable part of a failed ``iree-compile``: the first error with its location, SSA names and operands
    removed (the failing op, its ONNX name and types kept), or for a crash the signal, the assertion and the
    innermost compiler frames."""
    lines = output.splitlines()
    for line in lines:
        found = re.search(r"\berror: (.*)", line)
        if found:
            text = found.group(1)
            text = re.sub(r'\bloc\((?:[^()"]|"[^"]*"|\([^()]*\))*\):?\s*', "", text)  # loc("n"), loc(fused[...])
            text = re.sub(r"#loc\d*", "", text)
            text = re.sub(r"%[\w.$#-]+ = ", "", text)  # results
            text = re.sub(r'("[\w.]+")\((?:%[\w.$#-]+(?:, )?)*\)', r"\1", text)  # operand lists
            text = re.sub(r"%[\w.$#-]+", "%", text)
            return re.sub(r"\s+", " ", text).strip(" :")
    crashed = returncode < 0 or any("Stack dump:" in line for line in lines)
    if crashed:
        what = [f"iree-compile crashed (signal {-returncode})" if returncode < 0 else "iree-compile crashed"]
        for line in lines:
            assertion = re.search(r"(Assertion `.*' failed)", line)
            if assertion:
                what.append(assertion.group(1))
                break
        frames = []
        for line in lines:
            frame = re.match(r"\s*#\d+ 0x[0-9a-fA-F]+ (.+?)(?: \S+\.(?:cpp|cc|h|inc):\d+(?::\d+)?| \(.*\))?$", line)
            if not frame:
                continue
            symbol = re.sub(r"\s+\S+\.(?:cpp|cc|h|inc)(?::\d+)*$", "", frame.group(1)).strip()
            if re.search(r"PrintStackTrace|RunSignalHandlers|SignalHandler|^\(/|libc\.so|__restore_rt|raise|abort"
                         r"|__assert", symbol):
                continue
            frames.append(symbol)
            if len(frames) == 2:
                break
        if frames:
            what.append("in " + " <- ".join(frames))
        return "; ".join(what)
    tail = [line.strip() for line in lines if line.strip()]
    return f"iree-compile exited with code {returncode}" + (f": {tail[-1]}" if tail else "")


def compile_vmfb(command: list, timeout: float | None = None) -> str:
    """Run ``iree-compile``; raise :class:`IreeCompileError` with the stable diagnostic first when it fails."""
    done = subprocess.run(command, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    output = (done.stderr + done.stdout).decode("utf-8", errors="replace")
    if done.returncode != 0:
        raise IreeCompileError(f"{compile_diagnostic(output, done.returncode)}\n\n{output}")
    return output


def load_module(vmfb_path: Path | str, entry: str, device: str = "local-task") -> tuple:
    """Load a compiled module; returns (context, function) for the entry function (the ONNX graph's name)."""
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config(device))
    with open(vmfb_path, "rb") as fh:
        context.add_vm_module(rt.VmModule.copy_buffer(context.instance, fh.read()))
    module = context.modules.module
    names = [n for n in module.vm_module.function_names if not n.endswith("$async") and not n.startswith("__")]
    if entry not in names:
        if len(names) != 1:
            raise KeyError(f"the compiled module has no function {entry!r} (it has {names})")
        entry = names[0]
    return context, module[entry]


ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


def run_module(function: Callable, inputs: dict, input_names: list, outputs: list) -> dict:
    """Call the entry function with ``inputs`` in graph-input order; returns {output name: array}. IREE's
    integers are signless (a uint8 result comes back as int8), so a result whose element size matches the
    ONNX output type is reinterpreted as that type, never converted."""
    args = [np.ascontiguousarray(inputs[name]) for name in input_names]
    results = function(*args)
    if not isinstance(results, (list, tuple)):
        results = [results]
    produced = {}
    for (name, onnx_type), value in zip(outputs, results):
        array = np.asarray(value.to_host() if hasattr(value, "to_host") else value)
        declared = np.dtype(ONNX_DTYPES[onnx_type]) if onnx_type in ONNX_DTYPES else None
        if declared is not None and array.dtype != declared and array.dtype.itemsize == declared.itemsize \
                and array.dtype.kind in "biu" and declared.kind in "biu":
            array = array.view(declared)
        produced[name] = array
    return produced


# ---------------------------------------------------------------------------------- dispatch view
def dispatch_nodes(source: str, node_names: set[str]) -> list[str]:
    """The ONNX nodes whose computations one dumped dispatch source holds, in first-seen order.

    Only the locations of computing ops count: ``linalg``/``iree_linalg_ext`` ops and the region closers of
    ``linalg.generic``; the helpers the compiler shares between dispatches (``tensor.empty``,
    ``linalg.fill``, constants keep the location of whichever node created them first) do not.
    ``#locN`` aliases are resolved; fused locations give every name they hold.

    Example:
        >>> dispatch_nodes('%0 = tensor.empty() : tensor<4xf32> loc("stem")\\n'
        ...                '%1 = linalg.generic {...} ins(%a) outs(%0) {\\n'
        ...                '} -> tensor<4xf32> loc(#loc3)\\n'
        ...                '#loc3 = loc(fused["conv", "relu"])', {"stem", "conv", "relu"})
        ['conv', 'relu']
    """
    aliases = dict(re.findall(r"^(#loc\d*) = loc\((.*)\)\s*$", source, re.MULTILINE))
    found: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        computes = re.match(r"(?:%[\w:#]+(?:, %[\w:#]+)* = )?(?:linalg|iree_linalg_ext)\.(\w+)", text)
        if not (computes and computes.group(1) != "fill") and not re.match(r"\} -> ", text):
            continue
        located = re.search(r"\bloc\((.*)\)\s*$", text)
        if not located:
            continue
        where = located.group(1)
        where = str(aliases.get(where, where))
        found += re.findall(r'"([^"]*)"', where)
    return [name for name in dict.fromkeys(found) if name in node_names]


def dispatch_types(source: str) -> list[str]:
    """The element types one dumped dispatch computes on: the operand types (``ins(...)``) of its computing
    ``linalg``/``iree_linalg_ext`` ops, in first-seen order (IREE's integers are signless: ``i8`` is int8 or
    uint8; ``i1`` a boolean).

    Example:
        >>> dispatch_types('%7 = linalg.batch_matmul ins(%3, %4 : tensor<1x16x384xi8>, tensor<1x384x384xi8>) '
        ...                'outs(%6 : tensor<1x16x384xi32>) -> tensor<1x16x384xi32>')
        ['i8']
    """
    found: list[str] = []
    for line in source.splitlines():
        computes = re.search(r"(?:linalg|iree_linalg_ext)\.(\w+)\b.*?\bins\(([^)]*)\)", line)
        if not computes or computes.group(1) == "fill":
            continue
        _, _, types = computes.group(2).partition(":")
        found += re.findall(r"x?([if]\d+|bf16)>", types) + re.findall(r"^\s*([if]\d+|bf16)\s*$", types)
    return list(dict.fromkeys(found))


# --------------------------------------------------------------------------------------- runtime
class Iree:
    """IREE compiler + runtime on CPU (a :class:`~graphbisect.backends.base.Runtime`; see the module docstring).

    ``info()``: library versions, ``entry``, ``cpu``, ``compile_flags``, ``import_seconds``,
    ``compile_seconds``, with ``report_passes=1`` ``fired_passes``/``fired_required``/``feature_flags``, with
    ``report_dispatches=1`` ``dispatches`` ({dispatch: [ONNX nodes]}).
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        self.options = IreeOptions.parse(options)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._context: Any = None
        self._function: Any = None
        self._inputs: list[tuple[str, int]] = []
        self._outputs: list[tuple[str, int]] = []
        self._info: dict[str, Any] = {}
        self._cache = CompileCache.from_env()
        self._counts = {"compiles": 0, "compile_cache_hits": 0}
        self._count_lock = threading.Lock()

    def cost(self) -> dict[str, int]:
        """The ``iree-compile`` runs and the compile cache hits since this runtime was made (every compile
        counts: the model's, and each feature's for ``report_passes``)."""
        with self._count_lock:
            return dict(self._counts)

    def _compile(self, mlir: Path, vmfb: Path, flags: Sequence[str], dump: Path | None = None, *,
                 cached: bool = True) -> None:
        """``iree-compile`` ``mlir`` to ``vmfb``, or copy the module an identical compile made (same MLIR, flags,
        target CPU and compiler: :class:`CompileCache`), counting which. ``cached=False``: always compile
        (a compile that measures how two compiles of one input differ must really compile)."""
        command = compile_command(mlir, vmfb, self.options.cpu, list(flags), dump)
        cache = self._cache if cached and dump is None else None
        key = cache.key(mlir, command) if cache is not None else None
        if cache is not None and key is not None:
            hit = False
            try:
                hit = cache.fetch(key, vmfb)
            except IreeCompileError:
                hit = True  # the same compile failed before, with this diagnostic
                raise
            finally:
                if hit:
                    with self._count_lock:
                        self._counts["compile_cache_hits"] += 1
            if hit:
                return
        with self._count_lock:
            self._counts["compiles"] += 1
        try:
            compile_vmfb(command)
        except IreeCompileError as exc:
            if cache is not None and key is not None:
                cache.store_error(key, str(exc))
            raise
        if cache is not None and key is not None:
            cache.store(key, vmfb)

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Import, compile (a failure of either is a crash at load) and load the module."""
        self._context = self._function = None
        mlir, vmfb = self.workdir / "model.mlir", self.workdir / "model.vmfb"
        started = time.perf_counter()
        entry, self._inputs, self._outputs = import_onnx(model, mlir, list(outputs) if outputs is not None else None,
                                                            self.options.opset)
        imported = time.perf_counter()
        dump = self.workdir / "dispatches" if self.options.report_dispatches else None
        if dump is not None:
            _clear(dump)
        flags = self.options.compile_flags()
        self._info = {"entry": entry, "cpu": self.options.cpu, "compile_flags": flags,
                      "import_seconds": imported - started}
        try:
            self._compile(mlir, vmfb, flags, dump)
        except IreeCompileError as exc:
            exc.hint = newer_opset_hint(model, str(exc), self.options.opset)  # the verdict's line shows it
            raise
        self._info["compile_seconds"] = time.perf_counter() - imported
        if self.options.report_passes:
            self._info.update(self._fired(mlir, vmfb))
        if dump is not None:
            self._info["dispatches"] = _dispatches(dump, mlir)
            self._info["dispatch_types"] = {source.stem.removeprefix("module_"):
                                            dispatch_types(source.read_text(encoding="utf-8"))
                                            for source in sorted(dump.glob("*.mlir"))}
        self._context, self._function = load_module(vmfb, entry, self.options.device)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the entry function (feeds the model does not declare are ignored)."""
        if self._function is None:
            raise RuntimeError("no model loaded")
        names = [name for name, _ in self._inputs]
        feeds = select_feeds(inputs, names, set(names))
        return run_module(self._function, feeds, names, self._outputs)

    def registered_passes(self) -> list[str]:
        """Every compiler feature this spec can still switch off (the search space when no compile succeeded)."""
        return [name for name in FEATURES if name not in self.options.disabled]

    def info(self) -> dict[str, Any]:
        return {"library": "iree-base-compiler", "library_version": _version("iree-base-compiler"),
                "runtime_version": _version("iree-base-runtime"), **self._info}

    def _fired(self, mlir: Path, vmfb: Path) -> dict[str, Any]:
        """The enabled features whose disabling flag changes the compiled module: one compile per feature.

        Two compiles of the same input differ in a few bytes (IREE 3.13 writes a per-process value into a
        table of the embedded ELF, and the zip CRCs follow), so the baseline is compiled twice more and the
        aligned 8-byte words where any two of the three disagree are ignored (a word, not a byte: two values
        may share some bytes by chance): a feature *changed the program* when its module differs in length
        or in any other word.
        """
        baseline = vmfb.read_bytes()
        names = [name for name in FEATURES if name not in self.options.disabled]

        def compiled(tag: str, extra: Sequence[str]) -> bytes | None:
            other = self.workdir / f"without-{tag}.vmfb"
            try:
                # the baseline's compiles again measure the compiler's noise: never from the cache; a feature's
                # is the module a candidate disabling that feature alone compiles again (a cache hit there)
                self._compile(mlir, other, self.options.compile_flags(extra), cached=tag in FEATURES)
                return other.read_bytes()
            except IreeCompileError as exc:  # disabling it changes the program: it fails to compile without it
                logger.debug("iree: compiling without %s fails: %s", tag, str(exc).splitlines()[0])
                return None
            finally:
                other.unlink(missing_ok=True)

        # Each compile is a child process: run them side by side on the cores there are.
        with ThreadPoolExecutor(max_workers=max(1, min(len(names) + 2, os.cpu_count() or 1))) as pool:
            modules = list(pool.map(lambda tag: compiled(tag, [tag] if tag in FEATURES else []),
                                    ["same-1", "same-2", *names]))
        noise = _noise(baseline, modules[0], modules[1])
        changed = {name: module is None or _differs(baseline, module, noise)
                   for name, module in zip(names, modules[2:])}
        fired = [name for name in names if changed[name]]
        return {"fired_passes": fired, "fired_required": [],
                "unchanged_passes": [name for name in names if not changed[name]],
                "noise_bytes": None if noise is None else _WORD * int(noise.sum()),
                "feature_flags": {name: FEATURES[name] for name in fired}}


_WORD = 8

#: The environment variable that names the compile cache's folder (set by the host for its workers:
#: :func:`graphbisect.backends.process.compile_cache`); unset, empty or ``off``: no cache.
CACHE_ENV = "GRAPHBISECT_COMPILE_CACHE"


class CompileCache:
    """Compiled modules keyed by the content hash of what decides them: the MLIR, the ``iree-compile`` command
    line without its file paths (flags, target CPU), and the compiler (its version and binary). One command's
    runs share it (the host names the folder): the same model compiled twice with the same options — a
    feature listing's compile that a pass candidate repeats, a report fact's run of the baseline's model —
    compiles once. A compile that failed with a diagnostic is kept too (its message); a compiler that
    crashed is not (a crash may be chance, and a search must see it again). Entries are written atomically
    (a rename), so two workers sharing the folder never read half a module.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> CompileCache | None:
        folder = os.environ.get(CACHE_ENV, "").strip()
        return cls(Path(folder)) if folder and folder.lower() not in ("0", "off", "no") else None

    def key(self, mlir: Path, command: Sequence[str]) -> str:
        digest = hashlib.sha256()
        paths = {str(mlir)}
        words = [word for i, word in enumerate(command)
                 if word not in paths and not (i > 0 and command[i - 1] == "-o")]
        tool = Path(command[0])
        stat = tool.stat() if tool.exists() else None
        compiler = [_version("iree-base-compiler"), str(tool), stat.st_size if stat else None,
                    stat.st_mtime_ns if stat else None]
        digest.update(repr((compiler, words[1:])).encode())
        with open(mlir, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def fetch(self, key: str, vmfb: Path) -> bool:
        """Copy the cached module of ``key`` to ``vmfb`` (True), or raise its cached compile error; False: none."""
        error = self.folder / f"{key}.error"
        if error.is_file():
            raise IreeCompileError(error.read_text(encoding="utf-8"))
        module = self.folder / f"{key}.vmfb"
        if not module.is_file():
            return False
        shutil.copyfile(module, vmfb)
        return True

    def store(self, key: str, vmfb: Path) -> None:
        partial = self.folder / f"{key}.vmfb.{os.getpid()}.{threading.get_ident()}"
        shutil.copyfile(vmfb, partial)
        os.replace(partial, self.folder / f"{key}.vmfb")

    def store_error(self, key: str, message: str) -> None:
        if message.startswith("iree-compile crashed"):
            return
        partial = self.folder / f"{key}.error.{os.getpid()}.{threading.get_ident()}"
        partial.write_text(message, encoding="utf-8")
        os.replace(partial, self.folder / f"{key}.error")


def _words(data: bytes) -> np.ndarray:
    """``data`` as aligned 8-byte words (zero-padded), for word-wise comparison."""
    padded = data + b"\0" * (-len(data) % _WORD)
    return np.frombuffer(padded, np.uint64)


def _noise(baseline: bytes, *again: bytes | None) -> np.ndarray | None:
    """Words where compiles of the same input disagree (None: a length differs or a compile failed)."""
    if any(other is None or len(other) != len(baseline) for other in again):
        return None
    words = _words(baseline)
    return np.logical_or.reduce([_words(other) != words for other in again if other is not None])


def _differs(baseline: bytes, module: bytes, noise: np.ndarray | None) -> bool:
    if len(module) != len(baseline) or noise is None:
        return True
    return bool(((_words(module) != _words(baseline)) & ~noise).any())


def _clear(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.is_file():
            item.unlink()


def _dispatches(dump: Path, mlir: Path) -> dict[str, list[str]]:
    """{dispatch source file stem: ONNX node names located in it} from the dumped executable sources."""
    names = set(re.findall(r'^#loc\d+ = loc\("([^"]*)"\)', mlir.read_text(encoding="utf-8"), re.MULTILINE))
    names |= set(re.findall(r'\bloc\("([^"]*)"\)', mlir.read_text(encoding="utf-8")))
    view = {}
    for source in sorted(dump.glob("*.mlir")):
        view[source.stem.removeprefix("module_")] = dispatch_nodes(source.read_text(encoding="utf-8"), names)
    return view


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------ repro.py section
_REPRO_HOOKS = r'''

def import_library(options):
    """Import onnx and the two IREE packages; returns the compiler's version."""
    try:
        import iree.compiler  # noqa: F401
        import iree.runtime  # noqa: F401
        import onnx  # noqa: F401  (the ONNX importer needs it)
    except ImportError as exc:
        raise CannotRun(f"{exc}; pip install iree-base-compiler iree-base-runtime onnx") from exc
    from importlib.metadata import version

    return version("iree-base-compiler")


def load_target(model_path, options):
    """Import and compile exactly as graphbisect did (same target CPU and iree-compile flags); a failure of
    either raises IreeImportError / IreeCompileError whose first paragraph is the compiler's stable diagnostic."""
    import atexit
    import shutil

    work = Path(tempfile.mkdtemp(prefix="repro-iree-"))
    atexit.register(shutil.rmtree, work, True)  # the compiled module is used until the script ends
    entry, inputs, outputs = import_onnx(model_path, work / "model.mlir", None, options["opset"])
    compile_vmfb(compile_command(work / "model.mlir", work / "model.vmfb", options["cpu"], options["flags"]))
    context, function = load_module(work / "model.vmfb", entry, options["device"])
    return {"context": context, "function": function, "inputs": [name for name, _ in inputs], "outputs": outputs}


def run_target(target, inputs, output_names):
    """Call the entry function once with the bundle's inputs."""
    produced = run_module(target["function"], inputs, target["inputs"], target["outputs"])
    return {name: produced[name] for name in output_names if name in produced}
'''


def repro_section() -> str:
    """The ``iree`` section of the bundle's ``repro.py``: this module's pipeline functions, verbatim, and the
    ``import_library``/``load_target``/``run_target`` hooks the script calls (one implementation for both)."""
    import inspect

    parts: list[Any] = [IreeImportError, IreeCompileError, _declare_outputs_as_value_info, import_error, import_onnx,
                        compile_command, compile_diagnostic, compile_vmfb, load_module]
    code = "\n\n".join(inspect.getsource(part) for part in parts)
    dtypes = f"ONNX_DTYPES = {ONNX_DTYPES!r}\n"
    return ("\n# --------------------------------------- the target: IREE (ONNX import -> iree-compile -> runtime)\n"
            "from collections.abc import Callable\n\n\n" + code + "\n\n" + dtypes + "\n\n"
            + inspect.getsource(run_module) + _REPRO_HOOKS)
