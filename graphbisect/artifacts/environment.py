"""What machine and library versions produced a bundle: ``environment.json``.

A runtime engineer reading a bug report first asks "which version, which CPU, which GPU driver?". This
module answers without importing any heavy library: versions come from ``importlib.metadata`` (installed
distributions), the CPU from ``/proc/cpuinfo`` where it exists, and the GPU from ``nvidia-smi`` (with a
timeout, because a wedged driver can make it hang).

The backends' own versions are not this process's: a backend runs in a worker, maybe under another
interpreter (``python=``), which measures its library's version itself
(:attr:`~graphbisect.backends.RunResult.ran_with`). Those facts, one per role (oracle, target, control),
are recorded under ``backends``; ``packages`` are only the interpreter running graphbisect.

Example:
    >>> env = collect_environment()
    >>> {"python", "platform", "cpu", "gpus", "packages"} <= set(env)
    True
    >>> env["python"]["version"].count(".") >= 2
    True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphbisect._version import __version__
from graphbisect.text.shareable import file_name, shareable_ran_with

__all__ = ["DISTRIBUTIONS", "SHARED_MODULES", "backend_facts", "collect_environment", "describe_ran_with",
           "environment_summary", "shared_installs"]

logger = logging.getLogger(__name__)

#: Distributions whose versions go into environment.json when installed (several names per library:
#: GPU builds and vendor forks are published under other names).
DISTRIBUTIONS: tuple[str, ...] = (
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-openvino",
    "openvino",
    "paddlepaddle",
    "paddlepaddle-gpu",
    "paddle2onnx",
    "onnxoptimizer",
    "iree-base-compiler",
    "iree-base-runtime",  # an iree worker reports the compiler as its library; the runtime's version is here
    "tensorrt",
    "tensorrt-cu12",
    "tensorrt-cu13",
    "cuda-python",
    "protobuf",
)

#: CPU feature flags that change which kernels a backend picks (and so whether a numeric bug shows).
_CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
              "amx_int8", "amx_tile", "asimd", "sve")
NVIDIA_SMI_TIMEOUT = 10.0


def collect_environment(backends: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Python, platform, CPU, GPU and library versions of this machine, as a JSON-ready dict.

    ``backends`` maps a role (``oracle``, ``target``, ``control``...) to what ran it: ``spec`` and the
    worker's measured facts (``library``, ``library_version``, ``python``, ... — :func:`backend_facts`).
    They are recorded under ``backends`` with ``own_interpreter`` (whether graphbisect's interpreter ran it);
    ``packages`` holds this interpreter's versions only. Paths are shareable (:mod:`.shareable`): the
    interpreters by name, libraries from their ``site-packages`` on.
    """
    env: dict[str, Any] = {
        "graphbisect": __version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": file_name(sys.executable),
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "platform": platform.platform(),
        },
        "cpu": cpu_info(),
        "gpus": gpu_info(),
        "packages": package_versions(),
        "backends": {role: _shareable_facts(facts) for role, facts in (backends or {}).items()},
    }
    shared = shared_installs(env["packages"])
    if shared:
        env["shared_installs"] = shared
    if any(_elsewhere(facts) for facts in env["backends"].values()):
        env["note"] = ("packages are the versions of graphbisect's own interpreter; a backend that ran under "
                       "another one (python=) has the versions its worker measured under backends, and an "
                       "external program (command:) ran versions graphbisect cannot measure")
    return env


def backend_facts(spec: object, ran_with: Mapping[str, Any] | None) -> dict[str, Any]:
    """One role's entry of ``backends``: the spec and what its worker measured (``measured`` False when
    nothing was: then no version is claimed).

    Example:
        >>> backend_facts("onnxruntime", {"library": "onnxruntime", "library_version": "1.20.1"})["measured"]
        True
    """
    facts = {key: value for key, value in (ran_with or {}).items() if value is not None}
    return {"spec": str(spec), **facts, "measured": bool(facts)}


def describe_ran_with(facts: Mapping[str, Any] | None) -> str:
    """One line for a report: ``onnxruntime 1.20.1 (Python 3.11.7 /venv/bin/python, numpy 1.26.4)``.

    Example:
        >>> describe_ran_with({"library": "onnx", "library_version": "1.17.0", "python_version": "3.11.7",
        ...                    "python": "/usr/bin/python3", "numpy": "2.1.0"})
        'onnx 1.17.0 (Python 3.11.7 /usr/bin/python3, numpy 2.1.0)'
        >>> describe_ran_with({})
        'not measured'
        >>> describe_ran_with({"library": "onnx", "library_version": "1.17.0", "patched": ["Cast rounds"]})
        'onnx 1.17.0; patched by graphbisect: Cast rounds'
    """
    facts = facts or {}
    if not any(facts.get(key) for key in ("library", "library_version", "python")):
        return "not measured"  # no run of it, or an external program (command) whose version is unknown
    library = " ".join(str(facts[key]) for key in ("library", "library_version") if facts.get(key))
    interpreter = " ".join(str(facts[key]) for key in ("python_version", "python") if facts.get(key))
    where = ", ".join(part for part in (f"Python {interpreter}" if interpreter else "",
                                         f"numpy {facts['numpy']}" if facts.get("numpy") else "") if part)
    line = f"{library} ({where})" if library and where else library or where
    patched = facts.get("patched")
    return f"{line}; patched by graphbisect: {'; '.join(map(str, patched))}" if patched else line


def _shareable_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """A role's facts for environment.json: whether graphbisect's interpreter ran it (measured here, while
    the path says it), then its paths shareable."""
    own = {"own_interpreter": not _elsewhere(facts)} if facts.get("python") else {}
    return {**(shareable_ran_with(facts) or {}), **own}


def _elsewhere(facts: Mapping[str, Any]) -> bool:
    """Whether a backend may have run other versions than this interpreter's: it ran under another
    interpreter, or no interpreter was measured (an external program, ``command:``, runs whatever it runs)."""
    if "own_interpreter" in facts:  # recorded with the facts (their paths are names only)
        return not facts["own_interpreter"]
    python = facts.get("python")
    return not python or os.path.abspath(str(python)) != os.path.abspath(sys.executable)  # venvs link one binary


def package_versions(names: Sequence[str] = DISTRIBUTIONS) -> dict[str, str]:
    """Installed versions of ``names`` (absent distributions are left out)."""
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


#: Modules that several distributions of :data:`DISTRIBUTIONS` install (GPU builds beside CPU ones, in one folder).
SHARED_MODULES: Mapping[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
    "paddle": ("paddlepaddle", "paddlepaddle-gpu"),
}


def shared_installs(packages: Mapping[str, str]) -> dict[str, str]:
    """For a module that two of ``packages`` install (onnxruntime and onnxruntime-gpu), which one's files this
    interpreter imports (:func:`graphbisect.backends.installed.note`, found without importing it); empty
    otherwise. The versions a worker ran are its own measure (``backends``): this says why ``packages`` lists
    two versions of one library.

    Example:
        >>> shared_installs({"onnxruntime": "1.32.0", "numpy": "2.1.0"})
        {}
    """
    notes: dict[str, str] = {}
    for module, names in SHARED_MODULES.items():
        if sum(name in packages for name in names) < 2:
            continue
        from graphbisect.backends import installed  # here: only when two are installed

        spec = importlib.util.find_spec(module)
        text = installed.note(module, installed.installs_of(module, Path(spec.origin))) if spec and spec.origin \
            else None
        if text:
            notes[module] = text
    return notes


def cpu_info() -> dict[str, Any]:
    """Model name, logical cores and the kernel-relevant feature flags of this CPU."""
    info: dict[str, Any] = {"model": platform.processor() or None, "logical_cores": os.cpu_count()}
    fields = _proc_cpuinfo()
    if fields.get("model name"):
        info["model"] = fields["model name"]
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    if flags:
        info["flags"] = [flag for flag in _CPU_FLAGS if flag in flags]
    return info


def _proc_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's ``key: value`` fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def gpu_info(timeout: float = NVIDIA_SMI_TIMEOUT) -> list[dict[str, str]]:
    """NVIDIA GPUs as ``nvidia-smi`` lists them (name, driver, memory); empty without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "name,driver_version,memory.total,compute_cap"
    try:
        proc = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("nvidia-smi did not answer: %s", exc)
        return []
    if proc.returncode != 0:
        logger.info("nvidia-smi exited with %d: %s", proc.returncode, proc.stderr.strip()[:200])
        return []
    keys = query.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
            for line in proc.stdout.splitlines() if line.strip()]


def environment_summary(env: Mapping[str, Any], *, backends: bool = True) -> list[tuple[str, str]]:
    """(label, value) rows for a report: Python, OS, CPU, GPUs, what ran each role (not with ``backends``
    False: a report that lists them elsewhere) and library versions.

    Example:
        >>> dict(environment_summary({"python": {"version": "3.11.9"}, "packages": {"numpy": "2.1.0"}}))["numpy"]
        '2.1.0'
    """
    rows: list[tuple[str, str]] = []
    python = env.get("python") or {}
    if python:
        rows.append(("Python", f"{python.get('version', '?')} ({python.get('implementation', '?')})"))
    plat = env.get("platform") or {}
    if plat:
        rows.append(("OS", str(plat.get("platform") or plat.get("system") or "?")))
    cpu = env.get("cpu") or {}
    if cpu:
        flags = ", ".join(cpu.get("flags") or []) or "-"
        rows.append(("CPU", f"{cpu.get('model') or '?'} ({cpu.get('logical_cores') or '?'} logical cores; {flags})"))
    for gpu in env.get("gpus") or []:
        rows.append(("GPU", ", ".join(f"{k} {v}" for k, v in gpu.items())))
    roles = env.get("backends") or {}
    roles = roles if isinstance(roles, Mapping) else {}
    if backends:
        rows.extend((f"{role} ran", describe_ran_with(facts)) for role, facts in roles.items()
                    if isinstance(facts, Mapping))
    here = " (graphbisect's interpreter)" if any(_elsewhere(f) for f in roles.values()
                                                 if isinstance(f, Mapping)) else ""
    rows.extend((f"{name}{here}", str(version)) for name, version in (env.get("packages") or {}).items())
    shared = env.get("shared_installs")
    rows.extend((f"{module}{here}", str(text)) for module, text in (shared.items() if isinstance(shared, Mapping)
                                                                     else ()))
    return rows
