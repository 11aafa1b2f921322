"""An external program as a backend: ``command:cmd=python run.py {model} {inputs} {outputs}``.

The program reads the model and an ``.npz`` of inputs and writes an ``.npz`` of outputs. A non-zero exit or
a signal is a crash in the run phase whose message carries the exit status and the tail of the program's
stderr, so it becomes a crash signature. Without ``shell=1`` the template is split like a shell would
(``shlex``) and the placeholders are substituted inside the arguments (a path with spaces stays one
argument); with ``shell=1`` they are substituted shell-quoted and the line runs through ``/bin/sh``.
Literal braces are written ``{{`` and ``}}``; spec values cannot contain ``,``, so put longer command
lines in a script.

**Check mode** (Polygraphy's ``--check``): a template without ``{outputs}`` is a pass/fail check. Exit 0 means
the model is fine and the run has no outputs to compare; a non-zero exit is the failure, and its code is part
of the crash signature, so a reduction never drifts to a different exit code.

**Types numpy lacks.** An ``.npz`` cannot say that a tensor is bfloat16, float8 or int4: graphbisect stores
those as raw bits (``uint16``, ``uint8``) or values (``int8``) and names the type in an ``__values__.json``
member (:mod:`graphbisect.storage.values`), which a program that reads the arrays with plain numpy would take as
numbers. So such an input is refused as unsupported (naming it and its type) unless ``typed=1`` says the
program reads that manifest (``graphbisect.storage.values.load_values_npz`` does); an output written as untyped
bytes (``np.savez`` of an ``ml_dtypes`` array gives numpy ``void``) is refused too, never compared.

**Where it runs.** The program runs in the directory graphbisect was started from (the host passes it to its
workers as ``GRAPHBISECT_CALLER_CWD``), so ``python check.py {model}`` finds ``check.py`` there; ``{model}``,
``{inputs}`` and ``{outputs}`` are absolute paths. **A program that cannot run is not a failure**: exit 126
or 127 (not executable, not found), a command that cannot be started, an interpreter that cannot open its
script, or a usage error (exit 2 with ``usage:``) raise :class:`~graphbisect.errors.SpecError` — a usage
error with a hint, never a failure signature a reduction would shrink a model to.

**Its environment** (``venv=DIR``): the program runs with that environment first, as its ``activate`` script
would set it: ``DIR/bin`` at the start of ``PATH`` (which also finds the program itself), ``VIRTUAL_ENV=DIR``,
no ``PYTHONHOME``; so ``python`` and every console script installed there are the environment's. A relative
``DIR`` is relative to the directory the program runs in. ``package=NAME`` says which distribution is the
program's library: its version is **measured**, not assumed, once per worker, by the interpreter ``python`` names
on the program's ``PATH`` (``importlib.metadata``, with the program's environment), and reported as what ran
the target (:attr:`~graphbisect.backends.RunResult.ran_with`: ``library`` the name, ``library_version``, where
it is installed, that interpreter and its version, its numpy). Without ``package=`` nothing is claimed as what
ran: the worker only launches a program. ``graphbisect releases`` sets both for a ``command:`` target.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.base import UnsupportedType
from graphbisect.backends.children import run_program
from graphbisect.backends.worker import option_flag, save_npz
from graphbisect.errors import SpecError
from graphbisect.storage.onnxwire import declared_outputs
from graphbisect.storage.values import EXTENSION_TYPES, NpzDamaged, NpzRefused, elem_type_of, load_values_npz

__all__ = ["CALLER_CWD_ENV", "Command", "CommandFailed", "cannot_run", "check_mode", "program_environment"]

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("model", "inputs", "outputs")
_OPTIONS = ("cmd", "shell", "typed", "venv", "package")
#: How much of the program's stderr goes into a crash message.
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 4000
#: The environment variable that carries the directory graphbisect was started from into its workers.
CALLER_CWD_ENV = "GRAPHBISECT_CALLER_CWD"
#: Exit statuses of a shell that could not run the command: not executable, not found.
_CANNOT_RUN_CODES = {126: "is not executable", 127: "was not found"}
_CANNOT_OPEN = re.compile(r"can't open file|No such file or directory|command not found|not found$", re.MULTILINE)
_USAGE = re.compile(r"^usage: ", re.MULTILINE | re.IGNORECASE)
#: A distribution's name (PEP 508): what ``package=`` may name.
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
#: Seconds the program's interpreter may take to say which release of ``package=`` it has.
MEASURE_TIMEOUT = 120
#: Run by the program's interpreter (any Python 3.8+, standard library only): ``package=``'s distribution as
#: that interpreter finds it, the interpreter and its numpy, in :data:`~graphbisect.backends.base.RAN_WITH`'s keys.
_MEASURE = """
import importlib.metadata as m, json, platform, sys
def dist(name):
    try:
        return m.distribution(name)
    except m.PackageNotFoundError:
        return None
found, numpy = dist(sys.argv[1]), dist("numpy")
print(json.dumps({"library": sys.argv[1], "library_version": found.version if found else None,
                  "library_path": str(found.locate_file("")) if found else None, "python": sys.executable,
                  "python_version": platform.python_version(), "numpy": numpy.version if numpy else None}))
"""


class CommandFailed(RuntimeError):
    """The program exited non-zero, was killed by a signal, or wrote no usable outputs.

    ``exit_code`` follows :attr:`subprocess.Popen.returncode` (negative = signal) and becomes
    :attr:`RunResult.exit_code`.
    """

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Command:
    """Runs ``cmd`` once per invocation (see the module docstring)."""

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(f"the command backend has no option {', '.join(unknown)}", hint="valid: cmd, shell, typed")
        self.template = options.get("cmd", "").strip()
        if not self.template:
            raise SpecError("the command backend needs cmd=...",
                            hint="e.g. command:cmd=python run.py {model} {inputs} {outputs}")
        self.shell = option_flag(options, "shell")
        self.typed = option_flag(options, "typed")
        self.workdir = Path(workdir)
        _check_template(self.template)
        self.cwd = os.environ.get(CALLER_CWD_ENV) or str(self.workdir)
        self.venv = _venv(options.get("venv", "").strip(), self.cwd)
        self.env = program_environment(self.venv)
        self._measured = _measure(options["package"].strip(), self.env, self.cwd) if "package" in options else {}
        self._model = ""
        self._outputs: list[str] | None = None
        self._declared: dict[str, Any] | None = None
        self._last: str = ""

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Remember the model path and wanted outputs (the program does the real work in :meth:`run`)."""
        self._model, self._outputs = model, list(outputs) if outputs is not None else None
        self._declared = _declared_outputs(model, self._outputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Write the inputs, run the program, read its outputs; raise :class:`CommandFailed` if it failed."""
        if not self.typed:
            _refuse_typed_inputs(inputs)
        inputs_path = save_npz(self.workdir / "command-inputs.npz", inputs)
        outputs_path = self.workdir / "command-outputs.npz"
        with contextlib.suppress(FileNotFoundError):
            outputs_path.unlink()
        command = self.render(self._model, str(inputs_path), str(outputs_path))
        self._last = command if isinstance(command, str) else shlex.join(command)
        logger.debug("running %s", self._last)
        sys.stdout.flush()
        cwd = self.cwd
        try:  # waited for by its exit, not its stderr's end; what it left running is killed (children.py)
            returncode, stderr = run_program(command, shell=self.shell, cwd=cwd, folder=self.workdir, env=self.env)
        except OSError as exc:
            raise SpecError(f"the command cannot be started in {cwd}: {exc}",
                            hint=f"check the program name and its permissions: {self._last}") from exc
        sys.stderr.write(stderr)  # keep it in the worker log as well (its last TAIL_BYTES)
        sys.stderr.flush()
        why = cannot_run(returncode, stderr)
        if why is not None:
            raise SpecError(f"the command cannot run ({why}; it runs in {cwd}): {self._last}{_tail(stderr)}",
                            hint="fix the command line: a command that cannot run is never taken as the failure; "
                            "relative paths are relative to the directory graphbisect is started from")
        if returncode != 0:
            raise CommandFailed(f"command {_status_text(returncode)}{_tail(stderr)}", returncode)
        if self.check_mode:
            return {}
        return self._read_outputs(outputs_path)

    @property
    def check_mode(self) -> bool:
        """True when the template has no ``{outputs}``: the exit status alone is the verdict."""
        return check_mode(self.template)

    def info(self) -> dict[str, Any]:
        """The command line of the last run, and the environment it ran with (``venv=``)."""
        return {"command": self._last, **({"venv": str(self.venv)} if self.venv is not None else {})}

    def measured(self) -> dict[str, Any]:
        """What ran the target, as ``package=`` measured it in the program's interpreter (empty without it): the
        worker reports it instead of its own interpreter (:attr:`~graphbisect.backends.RunResult.ran_with`)."""
        return dict(self._measured)

    def render(self, model: str, inputs: str, outputs: str) -> str | list[str]:
        """The command line for these paths: a string with ``shell=1``, else an argument list."""
        values = {"model": model, "inputs": inputs, "outputs": outputs}
        if self.shell:
            return self.template.format(**{k: shlex.quote(v) for k, v in values.items()})
        return [part.format(**values) for part in shlex.split(self.template)]

    def _read_outputs(self, path: Path) -> dict[str, np.ndarray]:
        if not path.is_file():
            raise CommandFailed(f"command exited 0 but wrote no outputs file {path.name} (the {{outputs}} path)", 0)
        try:  # each member against the output it names, before it is decompressed (graphbisect.storage.npzguard)
            arrays = load_values_npz(path, self._declared)
        except NpzRefused as exc:  # 2 MB of deflated zeros declaring 1x2^29 float32 were read in full (issue 36)
            raise CommandFailed(f"command wrote an outputs file graphbisect does not read: {exc.message}", 0) from exc
        except NpzDamaged as exc:  # encrypted, another method, a wrong CRC
            raise CommandFailed(f"command wrote an unreadable outputs file: {exc.message}", 0) from exc
        except (OSError, ValueError) as exc:
            raise CommandFailed(f"command wrote an unreadable outputs file: {exc}", 0) from exc
        wanted = self._outputs if self._outputs is not None else list(arrays)
        missing = [name for name in wanted if name not in arrays]
        if missing:
            raise CommandFailed(f"command wrote no output named {', '.join(map(repr, missing))} "
                                f"(it wrote: {', '.join(map(repr, arrays)) or 'nothing'})", 0)
        for name in wanted:
            value = arrays[name]
            if isinstance(value, np.ndarray) and value.dtype.kind == "V":
                raise UnsupportedType("command", "output", name, f"untyped bytes (numpy {value.dtype.str})",
                                      "numpy cannot record a bfloat16/float8/int4 array's type in an .npz; write "
                                      "it with graphbisect.storage.values.save_values_npz, or as float32")
        return {name: arrays[name] for name in wanted}


def program_environment(venv: Path | None) -> dict[str, str]:
    """The program's environment: the worker's, with ``venv`` first as its ``activate`` script sets it
    (``bin`` at the start of ``PATH``, ``VIRTUAL_ENV``, no ``PYTHONHOME``)."""
    env = dict(os.environ)
    if venv is not None:
        scripts = venv / ("Scripts" if os.name == "nt" else "bin")
        env["PATH"] = os.pathsep.join(p for p in (str(scripts), env.get("PATH")) if p)
        env["VIRTUAL_ENV"] = str(venv)
        env.pop("PYTHONHOME", None)
    return env


def _venv(text: str, cwd: str) -> Path | None:
    """``venv=``'s folder (relative to where the program runs), checked to hold a ``bin`` (``Scripts``)."""
    if not text:
        return None
    folder = Path(cwd) / Path(text).expanduser()
    scripts = folder / ("Scripts" if os.name == "nt" else "bin")
    if not scripts.is_dir():
        raise SpecError(f"venv={text}: {folder} is not an environment (it has no {scripts.name}/ folder)",
                        hint="name a virtual environment's folder, e.g. venv=/opt/ort120 (the one holding bin/)")
    return folder.absolute()


def _measure(package: str, env: Mapping[str, str], cwd: str) -> dict[str, Any]:
    """``package``'s release as the interpreter ``python`` names on the program's ``PATH`` has it installed (the
    module docstring): :data:`_MEASURE` run there."""
    if not _DISTRIBUTION.match(package):
        raise SpecError(f"package={package!r} is not a distribution's name", hint="e.g. package=onnxruntime")
    path = env.get("PATH")
    python = shutil.which("python", path=path) or shutil.which("python3", path=path)
    if python is None:
        raise SpecError(f"package={package} is measured by the program's python, and its PATH has none",
                        hint="add venv=DIR (an environment with bin/python), or drop package=")
    try:
        proc = subprocess.run([python, "-c", _MEASURE, package], env=dict(env), cwd=cwd, capture_output=True,
                              text=True, timeout=MEASURE_TIMEOUT, check=False)
        facts = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise SpecError(f"package={package}: {python} cannot say which release it has: {exc}",
                        hint="check that the program's python runs") from exc
    if not isinstance(facts, dict):
        raise SpecError(f"package={package}: {python} cannot say which release it has (exit {proc.returncode})"
                        f"{_tail(proc.stderr)}", hint="check that the program's python runs (Python 3.8 or later)")
    logger.debug("package=%s measured by %s: %s", package, python, facts)
    return facts


def _declared_outputs(model: str, wanted: Sequence[str] | None) -> dict[str, Any] | None:
    """{output name: the dims ``model`` declares for it (None where dynamic)}: what an outputs file may hold
    (a wanted name the model does not declare, of any shape); None when ``model`` cannot be read as ONNX (no
    limit but the memory cap then)."""
    try:
        declared: dict[str, Any] = dict(declared_outputs(model))
    except (OSError, ValueError) as exc:  # not an ONNX file (a check of anything): the program's to read
        logger.debug("the outputs %s declares are unknown: %s", model, exc)
        return None
    for name in wanted or ():
        declared.setdefault(name, None)
    return declared


def _refuse_typed_inputs(inputs: Mapping[str, Any]) -> None:
    """Raise :class:`UnsupportedType` for the first input of a type numpy lacks (see the module docstring)."""
    for name, value in inputs.items():
        code = elem_type_of(value) if isinstance(value, np.ndarray) else None
        ext = EXTENSION_TYPES.get(code) if code is not None else None
        if ext is not None:
            raise UnsupportedType("command", "input", name, ext.onnx_name,
                                  "a numpy .npz cannot say so, and a program reading it with plain numpy would "
                                  f"take the stored {ext.storage} as numbers; add typed=1 to the spec if the "
                                  "program reads graphbisect's __values__.json "
                                  "(graphbisect.storage.values.load_values_npz)")


def _check_template(template: str) -> None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        parts = shlex.split(template)
    except ValueError as exc:
        raise SpecError(f"cmd={template!r} cannot be parsed: {exc}",
                        hint="balance quotes and braces; write literal braces as {{ and }}") from exc
    unknown = sorted(fields - set(PLACEHOLDERS))
    if unknown:
        raise SpecError(f"cmd={template!r} uses unknown placeholder(s) {', '.join('{' + f + '}' for f in unknown)}",
                        hint="placeholders are {model}, {inputs} and {outputs}; write literal braces as {{ and }}")
    if not parts:
        raise SpecError("cmd= is empty", hint="e.g. command:cmd=python run.py {model} {inputs} {outputs}")


def check_mode(template: str) -> bool:
    """Whether a command template is a pass/fail check (no ``{outputs}``): exit 0 is "no failure" and there is
    nothing to compare. ``repro.py`` and ``graphbisect verify`` judge a bundle of such a target the same way.

    Example:
        >>> check_mode("python check.py {model} {inputs}"), check_mode("run {model} {inputs} {outputs}")
        (True, False)
    """
    return "{outputs}" not in template


def cannot_run(returncode: int, stderr: str) -> str | None:
    """Why an exit status and stderr mean the program could not run at all (None: it ran).

    Example:
        >>> cannot_run(127, "sh: 1: chek: not found")
        'exit 127: the command was not found'
        >>> cannot_run(2, "python: can't open file '/w/check.py': [Errno 2] No such file or directory")
        "exit 2: python: can't open file '/w/check.py': [Errno 2] No such file or directory"
        >>> cannot_run(1, "AssertionError: outputs differ") is None
        True
    """
    if returncode in _CANNOT_RUN_CODES:
        return f"exit {returncode}: the command {_CANNOT_RUN_CODES[returncode]}"
    last = _last_line(stderr)
    if returncode == 2 and _USAGE.search(stderr):
        return f"exit 2, a usage error: {last}"
    if returncode == 2 and _CANNOT_OPEN.search(last):
        return f"exit 2: {last}"
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _status_text(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-returncode).name} ({-returncode})"
    return f"exited with code {returncode}"


def _tail(stderr: str) -> str:
    """The end of what the program wrote, as a second paragraph: the first one (the exit status) is the cause
    a failure signature keys on (``message_cause``); a program's log lines vary from run to run."""
    lines = stderr.strip().splitlines()[-STDERR_TAIL_LINES:]
    text = "\n".join(lines)[-STDERR_TAIL_CHARS:]
    return f"\n\n{text}" if text else ""
