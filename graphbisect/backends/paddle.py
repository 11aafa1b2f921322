"""Paddle Inference runtime: runs the *original* Paddle model (not the ONNX conversion).

Runs inside a worker process; imports only the standard library, numpy and graphbisect's stdlib-only
modules at module level, and Paddle lazily in :meth:`PaddleInference.load`.

**Which passes ran, and which fired.** Paddle does not return its optimization log through the API, it
prints it while :func:`paddle.inference.create_predictor` runs. On Paddle 3.3.1 (PIR programs, ``.json``)
every pass prints ``--- Running PIR pass [name]`` to fd 2 and, when its patterns matched, glog prints
``--- detected [N] subgraphs!`` (or ``[N, M]``: N matched of M) right after it. Legacy programs
(``.pdmodel``) print ``--- Running IR pass [name]`` and ``---  detected N subgraphs`` / ``--- fused N ...``.
The worker sends fd 2 to a log file the runtime cannot see, so :meth:`~PaddleInference.load` points fd 2
at a temporary file around ``create_predictor`` (``os.dup2``), parses it, and writes it back to the real
fd 2 so nothing is lost from the worker's log.

**Pass names.** Some oneDNN passes print a different name than the one they are registered under, and
``Config.delete_pass`` only knows the registered one: on Paddle 3.3.1 ``conv_activation_mkldnn_fuse_pass``
and ``conv_concat_activation_mkldnn_fuse_pass`` are logged, but only
``conv_activation_onednn_fuse_pass`` / ``conv_concat_activation_onednn_fuse_pass`` delete them (verified
by deleting every logged pass of a conv/bn/linear model one at a time; every other logged name deletes
its pass). Reported names are therefore normalized (``mkldnn`` → ``onednn``) to what ``delete_pass=``
accepts, and ``delete_pass=`` values are normalized the same way.

**Output names.** Paddle cannot expose intermediate tensors, so only the model's own outputs come back,
named as paddle2onnx names them in the converted ONNX model, so an oracle run on that ONNX model lines
up output by output. For PIR programs Paddle's output names *are* those names (``fetch_name_0``, ...).
For legacy programs Paddle reports the fetched variables (``linear_0.tmp_1``) while paddle2onnx
(which translates the program to PIR first) names outputs ``fetch_name_<i>`` in fetch order: the runtime
renames by position and reports the mapping as ``info()["output_names"]`` (ONNX name → Paddle name).
Both spellings are accepted in ``outputs``.

**What the optimized program computed.** With ``hooks=1`` the predictor's output hook
(``Predictor.register_output_hook``) sees every op output of the *optimized* program as it runs — fused
ops only, the program Paddle actually executes — under its op label (``onednn_op.fused_conv2d:0``: op
name and position) and a variable name of no use outside Paddle (``..._inner_var_8``). Each run returns
them too, keyed ``paddle-hook/<op label>`` (bf16 values as float32), and ``info()["hooked"]`` lists them
in execution order (``key``, ``op``, ``shape``, ``dtype``, ``block``, ``times``); the host maps them to the
converted ONNX model's tensors (:mod:`graphbisect.localize.paddle_hooks`). An op label is unique within a block
only: Paddle 3.3.1 runs each block (the program, a ``while`` body, an ``if`` branch) in an interpreter of its own
that numbers its ops from 0 and names its values ``<interpreter>_inner_var_<n>``, so a loop body's
``pd_op.embedding:0`` has the label of the program's first op and is hooked once per iteration. Each entry
says which block ran it (:func:`hook_blocks`: 0 the program, 1, 2, ... the others, None when the run cannot
tell); an op of another block is keyed ``paddle-hook/<op label>@block<k>``, and ``times`` counts the tensors
hooked under its key (one per iteration in a loop body, one per output of an op with several). A key
hooked more than once holds no single value: the run returns no value for it. Hooks observe; they do not change the
program, so this probe cannot mask anything. ``bf16=1`` (or ``precision=bf16``) runs oneDNN bf16 kernels
(``enable_mkldnn_bfloat16``), refused on CPUs without bf16 (AVX512-BF16/AMX), naming the missing flags.

**FP32 pins per op type.** Paddle's oneDNN bf16 is chosen per *op type* of the optimized program
(``Config.set_bfloat16_op``: the types allowed to run in bf16), never per op: no Paddle 3.3.1 API or op
attribute pins one op to FP32 (read in Paddle's source: both placement passes, legacy and PIR, set each op's
``mkldnn_data_type`` by its type and skip only ops already marked int8, or in PIR already bf16; the
per-op ``quantize_excluded_op_ids`` exists for int8 only). ``keep_fp32=A;B`` (or
``@FILE``, one type per line, read at every load) keeps those types in FP32 by allowing every *other*
registered op type (``set_bfloat16_op(all op names - keep)``). What ran is measured, not assumed: a
dtype-only output hook records which op types wrote bf16, and ``info()["keep_fp32"]`` reports
``low_precision_op_types`` (the compute types that wrote bf16; the quantize/dequantize conversions
Paddle inserts are left out), ``not_applied`` (kept types that ran in bf16 anyway) and ``unverified``
(kept types the optimized program does not run). Measured on Paddle 3.3.1: legacy programs
(``.pdmodel``) honour the list; **PIR programs** (``.json``) ignore it — their ``cpu_bfloat16_placement_pass``
places a fixed list of op types — so every kept type shows up in ``not_applied``. PIR hooks label
types with their dialect (``onednn_op.fused_conv2d``) where ``set_bfloat16_op`` has none: a kept type is
matched by its bare name, so either spelling is checked. An op type that
bf16 leaves between two FP32 ops is reverted to FP32 by Paddle itself (orphan removal), so allowing a
type does not mean it runs in bf16: ``low_precision_op_types`` says which did. The hook sees output
dtypes, not kernels: a type counts as bf16 when any of its ops writes bf16, so an op that computes in bf16
but writes FP32 (``force_fp32_output`` at the end of a bf16 region) is visible only through its siblings.

Example (inside a worker; the host normally does this through ``BackendProcess``):
    >>> rt = PaddleInference({"delete_pass": "conv2d_bias_bn_onednn_fuse_pass"}, "/tmp/w")  # doctest: +SKIP
    >>> rt.load("models/det/inference", None)  # doctest: +SKIP
    >>> rt.info()["fired_passes"]  # doctest: +SKIP
    ['conv2d_bias_fuse_pass', 'conv_activation_onednn_fuse_pass', ...]
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.base import UnsupportedType
from graphbisect.backends.worker import option_flag, option_int
from graphbisect.errors import BackendError, BackendUnavailableError, InputError, ModelError, SpecError
from graphbisect.storage.values import EXTENSION_TYPES, elem_type_of, sub_byte_bits

__all__ = [
    "BF16_CPU_FLAGS",
    "HOOK_PREFIX",
    "PaddleInference",
    "PassLog",
    "bf16_cpu_refusal",
    "hook_blocks",
    "normalize_pass_name",
    "onnx_output_names",
    "parse_pass_log",
]

logger = logging.getLogger(__name__)

_OPTIONS = ("device", "opt_level", "ir_optim", "delete_pass", "threads", "mkldnn", "hooks", "bf16", "precision",
            "keep_fp32")
#: Conversion ops the bf16 passes insert around bf16 regions: they write bf16 without computing in it.
_CONVERSION_OPS = frozenset({"quantize", "dequantize", "requantize", "reorder", "onednn_op.quantize",
                             "onednn_op.dequantize", "onednn_op.requantize"})
#: /proc/cpuinfo flags that give oneDNN bf16 kernels (either is enough).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
HOOK_PREFIX = "paddle-hook/"
_MODEL_SUFFIXES = (".json", ".pdmodel")
_PARAMS_SUFFIX = ".pdiparams"

_RUNNING = re.compile(r"--- Running (PIR|IR) pass \[([^\]]+)\]")
_DETECTED = re.compile(r"---\s+detected \[?\s*(\d+)")
_FUSED = re.compile(r"---\s+fused (\d+)")


def normalize_pass_name(name: str) -> str:
    """The name ``Config.delete_pass`` accepts for a pass as Paddle logs it.

    Example:
        >>> normalize_pass_name("conv_activation_mkldnn_fuse_pass")
        'conv_activation_onednn_fuse_pass'
        >>> normalize_pass_name("conv2d_bias_fuse_pass")
        'conv2d_bias_fuse_pass'
    """
    return name.strip().replace("mkldnn", "onednn")


_CONTAINED = re.compile(r"does not match the type of data \((\w+)\) currently contained")


def _paddle_input(name: str, value: Any) -> np.ndarray:
    """An input as ``copy_from_cpu`` takes it. Paddle 3.3.1 converts bfloat16 and float8 ``ml_dtypes`` arrays
    to the input's type with their values (checked against ``astype``), but reads the one byte per element
    of int4/uint4/int2/uint2 as int8 (int4 -2 is held as 14): those are refused."""
    array = np.asarray(value, order="C")  # keeps 0-d (np.ascontiguousarray makes it [1])
    code = elem_type_of(array)
    ext = EXTENSION_TYPES.get(code) if code is not None else None
    if ext is not None and sub_byte_bits(ext) and not ext.bits:
        raise UnsupportedType("Paddle Inference", "input", name, ext.onnx_name,
                              "Paddle has no such type and would read its one byte per element as int8")
    return array


def _paddle_output(name: str, handle: Any) -> np.ndarray:
    """An output copied to numpy, or :class:`UnsupportedType` where ``copy_to_cpu`` cannot read it: Paddle
    3.3.1 returns a bfloat16 output as float32 numbers read from its bytes (1.5, -2.25 came back as
    -2.2539, 0.501) and raises on float8 (whose handle reports FLOAT32)."""
    if str(handle.type()).endswith("BFLOAT16"):
        raise UnsupportedType("Paddle Inference", "output", name, "BFLOAT16",
                              "its copy_to_cpu returns float32 numbers read from the bfloat16 bytes")
    try:
        return np.asarray(handle.copy_to_cpu())
    except (ValueError, RuntimeError) as exc:
        contained = _CONTAINED.search(str(exc))
        if contained is None:
            raise
        raise UnsupportedType("Paddle Inference", "output", name, contained.group(1),
                              "its copy_to_cpu cannot read this type") from exc


@dataclass
class PassLog:
    """What Paddle's optimizer printed: passes in the order they ran, and how often each matched."""

    passes_run: list[str] = field(default_factory=list)  # unique, in first-run order, normalized names
    matches: dict[str, int] = field(default_factory=dict)  # normalized name -> total matched subgraphs
    ir: str | None = None  # "pir" or "legacy" (from the log lines), None when nothing was logged
    saw_match_lines: bool = False  # False: glog INFO was suppressed, firing is unknown

    @property
    def fired_passes(self) -> list[str]:
        """Passes that matched at least once, in run order."""
        return [name for name in self.passes_run if self.matches.get(name, 0) > 0]


def parse_pass_log(text: str) -> PassLog:
    """Parse the optimizer log Paddle printed during ``create_predictor``.

    A ``detected``/``fused`` line belongs to the last ``Running ... pass`` line before it.

    Example:
        >>> log = parse_pass_log(
        ...     "--- Running PIR pass [conv2d_bias_fuse_pass]\\n"
        ...     "I1121 print_statistics.cc:50] --- detected [1] subgraphs!\\n"
        ...     "--- Running PIR pass [conv_activation_mkldnn_fuse_pass]\\n"
        ...     "--- Running PIR pass [matmul_scale_fuse_pass]\\n"
        ... )
        >>> log.passes_run
        ['conv2d_bias_fuse_pass', 'conv_activation_onednn_fuse_pass', 'matmul_scale_fuse_pass']
        >>> log.fired_passes
        ['conv2d_bias_fuse_pass']
    """
    log = PassLog()
    current: str | None = None
    detected = fused = 0  # of the current pass occurrence

    def close() -> None:
        # Legacy passes may print both "detected 1 subgraphs" and "fused 1 ...": that is one match.
        if current is not None:
            log.matches[current] += detected or fused

    for line in text.splitlines():
        running = _RUNNING.search(line)
        if running:
            close()
            log.ir = "pir" if running.group(1) == "PIR" else "legacy"
            current = normalize_pass_name(running.group(2))
            detected = fused = 0
            if current not in log.matches:
                log.passes_run.append(current)
                log.matches[current] = 0
            continue
        if match := _DETECTED.search(line):
            log.saw_match_lines = True
            detected += int(match.group(1))
        elif match := _FUSED.search(line):
            log.saw_match_lines = True
            fused = max(fused, int(match.group(1)))
    close()
    return log


def bf16_cpu_refusal(cpuinfo: str | None = None) -> str | None:
    """Why this CPU cannot run oneDNN bf16 kernels (naming the missing flags), or None when it can.

    ``cpuinfo`` is the text of ``/proc/cpuinfo`` (read when None); None is returned too when it cannot be
    read (not Linux): Paddle's own ``supports_bfloat16()`` decides then.

    Example:
        >>> bf16_cpu_refusal("flags : fpu avx2 avx512f")
        'this CPU has neither avx512_bf16 nor amx_bf16 in its /proc/cpuinfo flags (it has avx512f)'
        >>> bf16_cpu_refusal("flags : fpu avx512f avx512_bf16") is None
        True
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    if not flags or any(flag in flags for flag in BF16_CPU_FLAGS):
        return None
    near = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    return (f"this CPU has neither {' nor '.join(BF16_CPU_FLAGS)} in its /proc/cpuinfo flags"
            f" (it has {', '.join(near) if near else 'no AVX512/AMX flag'})")


@contextlib.contextmanager
def _capture_fd2(workdir: Path) -> Iterator[list[str]]:
    """Send fd 2 to a temporary file for the duration; yield a list that receives the captured text.

    The text is written back to the real fd 2 afterwards, so the worker's log still holds it.
    """
    sink: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile(dir=workdir if workdir.is_dir() else None) as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            view = memoryview(data)
            with contextlib.suppress(OSError):
                while view:
                    view = view[os.write(2, view) :]
            sink.append(data.decode("utf-8", errors="replace"))


def _glog_info_on() -> None:
    """Let Paddle's glog print INFO: its "detected [N] subgraphs" lines are INFO, and without them which
    passes fired is unknown. glog reads ``GLOG_minloglevel`` once, when Paddle is imported, so this must
    happen before anything in the worker imports it: the worker's ``init`` imports Paddle for its version
    right after creating the runtime, and ``validate`` before the first ``load``."""
    glog_level = os.environ.get("GLOG_minloglevel", "0")  # noqa: SIM112 (glog's own spelling)
    if glog_level in ("", "0"):
        return
    if "paddle" in sys.modules:
        logger.warning("GLOG_minloglevel=%s and Paddle is already imported: which passes fired is unknown",
                       glog_level)
        return
    logger.info("setting GLOG_minloglevel=0 (was %s) so Paddle reports which passes fired", glog_level)
    os.environ["GLOG_minloglevel"] = "0"  # noqa: SIM112


#: A value of a Paddle 3.3.1 PIR interpreter: ``<interpreter>_inner_var_<n>`` (``<interpreter>``: its address and
#: creation time); the program's named values (feeds, fetches) carry their own names.
_INNER_VAR = re.compile(r"^(.+)_inner_var_\d+$")


def hook_blocks(var_names: Sequence[str]) -> list[int | None]:
    """The block that ran each hooked op, from the variables it wrote (execution order): 0 for the program,
    1, 2, ... for the other blocks (loop bodies, branches) in order of first appearance, None when it cannot be told.

    Each block runs in an interpreter of its own, which names its values ``<interpreter>_inner_var_<n>``; a
    named value (``fetch_name_0``) is the program's. A body's ops run inside its control-flow op, before that op's
    own hook, so the program's interpreter is the one of the first op hooked and of the last: when those two
    differ (the program starts with a loop, or ends with one whose outputs are all fetched), which interpreter is
    the program's is not known and every interpreter's ops are None.

    Example:
        >>> hook_blocks(["0xa1_inner_var_3", "0xb2_inner_var_0", "0xb2_inner_var_1", "0xa1_inner_var_4",
        ...              "fetch_name_0"])
        [0, 1, 1, 0, 0]
        >>> hook_blocks(["0xb2_inner_var_0", "0xa1_inner_var_4"])
        [None, None]
    """
    interpreters = [match.group(1) if (match := _INNER_VAR.match(name)) else None for name in var_names]
    seen = [i for i in interpreters if i is not None]
    if not seen:
        return [0] * len(var_names)
    if seen[0] != seen[-1]:
        return [None if i is not None else 0 for i in interpreters]
    number = {i: k for k, i in enumerate(dict.fromkeys(seen))}
    return [0 if i is None else number[i] for i in interpreters]


def _op_type(label: str) -> str:
    """The op type of an output hook's op label: PIR ``onednn_op.fused_conv2d:3`` -> ``onednn_op.fused_conv2d``;
    legacy programs label ops by type alone (``fused_conv2d``).

    >>> _op_type("onednn_op.fused_conv2d:3"), _op_type("fused_conv2d")
    ('onednn_op.fused_conv2d', 'fused_conv2d')
    """
    head, sep, tail = label.rpartition(":")
    return head if sep and tail.isdigit() else label


def _bare_op_type(op_type: str) -> str:
    """An op type without its PIR dialect, as ``set_bfloat16_op`` names it.

    >>> _bare_op_type("onednn_op.fused_conv2d"), _bare_op_type("fused_conv2d")
    ('fused_conv2d', 'fused_conv2d')
    """
    return op_type.rpartition(".")[2]


def _resolve_model(model: str) -> tuple[Path, Path]:
    """(program file, params file) of a Paddle model given as folder, prefix or file.

    Mirrors :func:`graphbisect.model.paddle.resolve_paddle_model`, which this module must not import: it
    runs in workers whose interpreter may lack onnx, which ``graphbisect.model`` needs.
    """
    path = Path(model).expanduser()
    candidates: list[Path]
    if path.is_dir():
        rank = {"inference": 0, "model": 1}
        stems = sorted(
            {p.stem for p in path.iterdir() if p.suffix in _MODEL_SUFFIXES}, key=lambda s: (rank.get(s, 2), s)
        )
        candidates = [path / f"{s}{suffix}" for s in stems for suffix in _MODEL_SUFFIXES]
    elif path.suffix in _MODEL_SUFFIXES:
        candidates = [path]
    else:
        prefix = path.with_suffix("") if path.suffix == _PARAMS_SUFFIX else path
        candidates = [Path(f"{prefix}{suffix}") for suffix in _MODEL_SUFFIXES]
    for candidate in candidates:
        params = candidate.with_suffix(_PARAMS_SUFFIX)
        if candidate.is_file() and params.is_file():
            return candidate, params
    raise ModelError(
        f"no Paddle inference model at {model}: expected <name>.json or <name>.pdmodel with <name>.pdiparams",
        hint="the paddle backend runs the original Paddle model: pass its folder or path prefix "
        "(dir/inference), not the converted .onnx file",
    )


def onnx_output_names(model_file: Path, paddle_names: Sequence[str]) -> list[str]:
    """The names paddle2onnx gives the outputs of ``model_file``, in Paddle's output order.

    PIR programs keep their fetch names; legacy programs are translated to PIR by paddle2onnx, whose
    re-saved program names fetches ``fetch_name_<i>`` (verified with paddle2onnx 2.1 on Paddle 3.3.1).

    Example:
        >>> onnx_output_names(Path("m/inference.pdmodel"), ["linear_0.tmp_1", "mean_0.tmp_0"])
        ['fetch_name_0', 'fetch_name_1']
        >>> onnx_output_names(Path("m/inference.json"), ["fetch_name_0"])
        ['fetch_name_0']
    """
    if model_file.suffix == ".pdmodel":
        return [f"fetch_name_{i}" for i in range(len(paddle_names))]
    return list(paddle_names)


def _select_outputs(
    model_file: Path, onnx_names: Sequence[str], paddle_names: Sequence[str], outputs: Sequence[str] | None
) -> dict[str, str]:
    """Returned name -> Paddle output name for the requested ``outputs`` (None = all, under ONNX names).

    Either spelling of an output is accepted; anything else is an intermediate Paddle cannot expose.
    """
    if outputs is None:
        return dict(zip(onnx_names, paddle_names, strict=True))
    by_name = {**dict(zip(onnx_names, paddle_names, strict=True)), **{p: p for p in paddle_names}}
    missing = [name for name in outputs if name not in by_name]
    if missing:
        raise ModelError(
            f"Paddle Inference cannot expose intermediate tensors: {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''} {'is' if len(missing) == 1 else 'are'} not "
            f"output(s) of {model_file.name} (outputs: {', '.join(onnx_names)})",
            hint="the paddle backend lacks the 'intermediates' capability: compare model outputs only, "
            "or compare intermediates on an ONNX backend (onnxruntime, openvino) of the converted model",
        )
    return {name: by_name[name] for name in outputs}


class PaddleInference:
    """Paddle Inference predictor on the original Paddle model (see the module docstring).

    Options (all strings, from the backend spec): ``device`` (``cpu`` default, ``gpu`` or ``gpu:N``),
    ``opt_level`` (0-3, ``Config.set_optimization_level``; 0 leaves only bookkeeping passes, 2 is
    Paddle's default), ``ir_optim`` (0: ``switch_ir_optim(False)``, which does *not* stop PIR passes),
    ``delete_pass`` (``;``-separated), ``threads`` (CPU math library threads), ``mkldnn`` (1/0: enable or
    disable oneDNN; absent: Paddle's default, which on x86 CPU builds of Paddle 3.3.1 is *enabled*).
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(
                f"paddle backend has no option(s) {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}"
            )
        self._options = dict(options)
        self._workdir = Path(workdir)
        _glog_info_on()
        device = self._options.get("device", "cpu").strip().lower()
        kind, _, index = device.partition(":")
        if kind not in ("cpu", "gpu") or (index and not index.isdigit()) or (kind == "cpu" and index):
            raise SpecError(f"paddle option device={device!r} is not cpu, gpu or gpu:N", hint="e.g. device=gpu:0")
        self._device = kind
        self._device_id = int(index or 0)
        self._opt_level = option_int(self._options, "opt_level", 0, 3)
        self._ir_optim = option_flag(self._options, "ir_optim", None)
        self._mkldnn = option_flag(self._options, "mkldnn", None)
        self._threads = option_int(self._options, "threads", 1)
        self._hooks = bool(option_flag(self._options, "hooks", False))
        precision = self._options.get("precision", "f32").strip().lower()
        if precision not in ("f32", "fp32", "bf16"):
            raise SpecError(f"paddle option precision={precision!r} is not f32 or bf16",
                            hint="Paddle Inference's CPU reduced precision is oneDNN bf16: precision=bf16")
        self._bf16 = bool(option_flag(self._options, "bf16", False)) or precision == "bf16"
        self._keep_fp32 = self._options.get("keep_fp32")
        if self._keep_fp32 is not None and not self._bf16:
            raise SpecError("paddle option keep_fp32= keeps op types in FP32 under bf16, but bf16 is off",
                            hint="add precision=bf16 (or bf16=1)")
        pin_file = self._keep_fp32[1:] if self._keep_fp32 is not None and self._keep_fp32.startswith("@") else None
        if pin_file is not None and not Path(pin_file).is_absolute():
            raise SpecError(f"paddle option keep_fp32={self._keep_fp32}: the file must be an absolute path",
                            hint="write keep_fp32=@/abs/path.txt (one Paddle op type per line) or keep_fp32=TYPE;TYPE")
        self._written: dict[str, str] = {}  # op type -> dtype of its last output (keep_fp32 runs)
        self._hooked: list[tuple[str, str, str, np.ndarray]] = []  # op label, variable, dtype, value
        raw_deleted = [p for p in self._options.get("delete_pass", "").split(";") if p.strip()]
        self._deleted = list(dict.fromkeys(normalize_pass_name(p) for p in raw_deleted))
        self._predictor: Any = None
        self._input_names: list[str] = []
        self._outputs: dict[str, str] = {}  # returned name -> Paddle output name
        self._info: dict[str, Any] = {}

    def validate(self) -> None:
        """Check option values against the installed Paddle (called by the host before the first run).

        ``delete_pass`` names cannot be checked: Paddle does not expose its PIR pass registry and silently
        ignores unknown names; ``info()["passes_run"]`` shows what really ran.
        """
        import paddle
        from paddle import inference as paddle_infer

        if self._device == "gpu" and not paddle.is_compiled_with_cuda():
            raise BackendUnavailableError(
                f"paddle device=gpu asked, but this Paddle ({paddle.__version__}) is a CPU build",
                hint="install paddlepaddle-gpu in the backend's interpreter (python=...), or use device=cpu",
            )
        if self._bf16 and (self._device != "cpu" or not paddle.base.core.supports_bfloat16()):
            why = ("this is not a CPU run" if self._device != "cpu"
                   else bf16_cpu_refusal() or "Paddle reports no oneDNN bf16 support on this CPU")
            raise BackendUnavailableError(
                f"paddle bf16 asked, but {why}: oneDNN bf16 needs AVX512-BF16 or AMX",
                hint="drop bf16=1/precision=bf16, or run on a CPU whose /proc/cpuinfo lists avx512_bf16 or amx_bf16",
            )
        if self._opt_level is not None and not hasattr(paddle_infer.Config, "set_optimization_level"):
            raise SpecError(
                f"paddle option opt_level: this Paddle ({paddle.__version__}) has no Config.set_optimization_level",
                hint="use Paddle >= 3.0, or drop opt_level (ir_optim=0 and delete_pass= still work)",
            )

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Create the predictor for the Paddle model at ``model`` (folder, prefix or program file).

        ``outputs`` may name model outputs only (ONNX or Paddle spelling); Paddle cannot expose
        intermediate tensors, so any other name fails here.
        """
        model_file, params_file = _resolve_model(model)
        import paddle
        from paddle import inference as paddle_infer

        config = self._config(paddle, paddle_infer.Config(str(model_file), str(params_file)))
        with _capture_fd2(self._workdir) as captured:
            predictor = paddle_infer.create_predictor(config)
        pass_log = parse_pass_log(captured[0] if captured else "")
        if self._hooks:
            predictor.register_output_hook(self._hook)
        elif self._keep_fp32 is not None:
            predictor.register_output_hook(self._dtype_hook)

        paddle_outputs = list(predictor.get_output_names())
        onnx_names = onnx_output_names(model_file, paddle_outputs)
        selected = _select_outputs(model_file, onnx_names, paddle_outputs, outputs)

        deleted_but_ran = [name for name in self._deleted if name in pass_log.matches]
        if deleted_but_ran:
            logger.warning("Paddle ran passes that delete_pass named: %s", ", ".join(deleted_but_ran))
        if pass_log.passes_run and not pass_log.saw_match_lines:
            logger.warning("Paddle printed no 'detected [N] subgraphs' lines (glog INFO off?): fired passes unknown")

        self._predictor = predictor
        self._input_names = list(predictor.get_input_names())
        self._outputs = selected
        self._info = {
            "paddle_version": paddle.__version__,
            "model_file": str(model_file),
            "ir": "pir" if model_file.suffix == ".json" else "legacy",
            "device": self._device if self._device == "cpu" else f"gpu:{self._device_id}",
            "mkldnn": bool(config.mkldnn_enabled()),
            "bf16": self._bf16,
            "ir_optim": bool(config.ir_optim()),
            "opt_level": self._opt_level,
            "deleted_passes": list(self._deleted),
            "deleted_but_ran": deleted_but_ran,
            "passes_run": pass_log.passes_run,
            "fired_passes": pass_log.fired_passes,
            "pass_matches": {k: v for k, v in pass_log.matches.items() if v},
            "fired_passes_known": pass_log.saw_match_lines or not pass_log.passes_run,
            "input_names": self._input_names,
            "output_names": dict(zip(onnx_names, paddle_outputs, strict=True)),
        }

    def _config(self, paddle: Any, config: Any) -> Any:
        """Apply the spec's options to a fresh ``paddle.inference.Config``."""
        if self._device == "gpu":
            if not paddle.is_compiled_with_cuda():
                raise BackendUnavailableError(
                    f"paddle device=gpu asked, but this Paddle ({paddle.__version__}) is a CPU build",
                    hint="install paddlepaddle-gpu in the backend's interpreter (python=...), or use device=cpu",
                )
            config.enable_use_gpu(256, self._device_id)
        else:
            config.disable_gpu()
        if self._opt_level is not None:
            if not hasattr(config, "set_optimization_level"):
                raise SpecError(
                    f"paddle option opt_level: this Paddle ({paddle.__version__}) has no Config.set_optimization_level",
                    hint="use Paddle >= 3.0, or drop opt_level (ir_optim=0 and delete_pass= still work)",
                )
            config.set_optimization_level(self._opt_level)
        if self._ir_optim is not None:
            config.switch_ir_optim(self._ir_optim)
        if self._bf16:
            config.enable_mkldnn()
            config.enable_mkldnn_bfloat16()
        if self._keep_fp32 is not None:
            # Allowing every other registered op type is the only form of "keep these in FP32" Paddle has.
            config.set_bfloat16_op(set(paddle.base.core.get_all_op_names()) - set(self.keep_fp32_types()))
        if self._mkldnn is True:
            config.enable_mkldnn()
        elif self._mkldnn is False:
            config.disable_mkldnn()
        if self._threads is not None:
            config.set_cpu_math_library_num_threads(self._threads)
        for name in self._deleted:
            config.delete_pass(name)
        return config

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Feed ``inputs`` (by input name), run the predictor, and return the selected outputs."""
        if self._predictor is None:
            raise BackendError("PaddleInference.run called before load", hint="call load(model, outputs) first")
        missing = [name for name in self._input_names if name not in inputs]
        extra = [name for name in inputs if name not in self._input_names]
        if missing or extra:
            raise InputError(
                f"Paddle model inputs are {', '.join(self._input_names)}; "
                + (f"missing: {', '.join(missing)}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"unknown: {', '.join(extra)}" if extra else ""),
                hint="feed exactly the model's inputs (the converted ONNX model has the same input names)",
            )
        for name in self._input_names:
            array = _paddle_input(name, inputs[name])
            handle = self._predictor.get_input_handle(name)
            handle.reshape(list(array.shape))
            handle.copy_from_cpu(array)
        self._hooked = []
        self._written = {}
        self._predictor.run()
        outputs = {name: _paddle_output(name, self._predictor.get_output_handle(paddle_name))
                   for name, paddle_name in self._outputs.items()}
        if self._hooks:
            blocks = hook_blocks([var for _, var, _, _ in self._hooked])
            keys = [HOOK_PREFIX + label + (f"@block{block}" if block else "")
                    for (label, _, _, _), block in zip(self._hooked, blocks, strict=True)]
            times = Counter(keys)
            # a key hooked more than once (a loop body's op, an op with several outputs) has no single value
            outputs.update({key: array for key, (_, _, _, array) in zip(keys, self._hooked, strict=True)
                            if times[key] == 1})
            self._info["hooked"] = [{"key": key, "op": label.rpartition(":")[0], "shape": list(array.shape),
                                     "dtype": dtype, "block": block, "times": times[key]}
                                    for key, block, (label, _, dtype, array)
                                    in zip(keys, blocks, self._hooked, strict=True)]
            for label, _, dtype, _ in self._hooked:
                self._note_dtype(label, dtype)
        if self._keep_fp32 is not None:
            self._info["keep_fp32"] = self._pin_facts()
        return outputs

    def keep_fp32_types(self) -> list[str]:
        """The op types of option ``keep_fp32`` (the file is read now, see the module docstring)."""
        value = self._keep_fp32 or ""
        if value.startswith("@"):
            try:
                value = Path(value[1:]).read_text(encoding="utf-8").replace("\n", ";")
            except OSError as exc:
                raise SpecError(f"paddle option keep_fp32: cannot read {value[1:]}: {exc}",
                                hint="write one Paddle op type per line to an absolute path") from exc
        return sorted({name.strip() for name in value.split(";") if name.strip()})

    def load_key(self) -> str:
        """What besides the model file decides the predictor: the ``keep_fp32`` types (the worker reloads
        when they change, as a precision search rewrites the file between runs)."""
        return ";".join(self.keep_fp32_types()) if self._keep_fp32 is not None else ""

    def _pin_facts(self) -> dict[str, Any]:
        """``info()["keep_fp32"]``: what the last run computed in bf16, per op type, against the pins."""
        low = sorted(t for t, dtype in self._written.items() if dtype == "bfloat16" and t not in _CONVERSION_OPS)
        kept = self.keep_fp32_types()
        # PIR hooks label ops with their dialect (onednn_op.fused_conv2d), set_bfloat16_op and legacy hooks do
        # not (fused_conv2d): a kept type is matched by its bare name, in either spelling.
        low_bare = {_bare_op_type(t) for t in low}
        ran_bare = {_bare_op_type(t) for t in self._written}
        facts: dict[str, Any] = {
            "requested": kept,
            "low_precision_op_types": low,
            "op_types": sorted(t for t in self._written if t not in _CONVERSION_OPS),
            "not_applied": [t for t in kept if _bare_op_type(t) in low_bare],
            "partly_applied": [],
            "unverified": [t for t in kept if _bare_op_type(t) not in ran_bare],
        }
        if facts["not_applied"]:
            facts["why"] = (
                "Paddle computed op types in bf16 that set_bfloat16_op left out"
                + (": Paddle PIR programs (.json) place bf16 ops by a fixed list and ignore set_bfloat16_op "
                   "(measured on Paddle 3.3.1); export a legacy program (.pdmodel) for per-op-type control"
                   if self._info.get("ir") == "pir" else "")
            )
        return facts

    def _dtype_hook(self, op_label: str, _var: str, tensor: Any) -> None:
        """Output hook of ``keep_fp32`` runs: only the dtype each op type wrote (no copy of the values)."""
        self._note_dtype(op_label, str(tensor.dtype).removeprefix("paddle."))

    def _note_dtype(self, op_label: str, dtype: str) -> None:
        kind = _op_type(op_label)
        if self._written.get(kind) != "bfloat16":  # one bf16 output marks the type as computed in bf16
            self._written[kind] = dtype

    def _hook(self, op_label: str, var: str, tensor: Any) -> None:
        """Output hook: keep a copy of one op output of the optimized program (bf16 read as float32).

        A oneDNN op's output is in oneDNN's memory layout (e.g. blocked ``nChw8c``): ``numpy()`` returns
        those bytes under the logical shape, while ``clone()`` reorders to the plain layout (verified on
        Paddle 3.3.1: ``numpy()`` of a fused_conv2d output differed from ONNX Runtime by 2.7, the clone
        by 1e-6).
        """
        dtype = str(tensor.dtype).removeprefix("paddle.")
        try:
            plain = tensor.clone() if str(getattr(tensor, "layout", "")).upper() == "ONEDNN" else tensor
            value = plain.astype("float32").numpy() if dtype == "bfloat16" else plain.numpy()
        except Exception as exc:  # a tensor Paddle cannot copy out is skipped, not fatal
            logger.debug("output hook: cannot read %s (%s): %s", op_label, dtype, exc)
            return
        self._hooked.append((op_label, var, dtype, np.array(value, copy=True)))

    def info(self) -> dict[str, Any]:
        """Facts about the last load: versions, effective config, passes run/fired, output name mapping."""
        return dict(self._info)
