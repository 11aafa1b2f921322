"""The ``command`` section of ``repro.py``: the spec's external command, arrays in and out as files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import ReproBackend
from graphbisect.backends.command import _CANNOT_OPEN, _CANNOT_RUN_CODES, _MEASURE, _USAGE, MEASURE_TIMEOUT
from graphbisect.backends.inert import ANY, COMMAND_ENVIRONMENT, COMMAND_PROGRAM
from graphbisect.backends.worker import option_flag


def _command_options(options: Mapping[str, str]) -> dict[str, Any]:
    return {"cmd": options.get("cmd", ""), "shell": option_flag(options, "shell"),
            "typed": option_flag(options, "typed"), **({"venv": options["venv"]} if options.get("venv") else {}),
            **({"package": options["package"].strip()} if options.get("package", "").strip() else {})}


_COMMAND_CODE = r'''
# --------------------------------------------------------------------- the target: an external command
class CommandFailed(RuntimeError):
    """The command exited non-zero or wrote no outputs (same class name and first line as graphbisect's)."""


MEASURE = @MEASURE@


def import_library(options):
    """Nothing to import for an external command: check there is a command template. With package= (the spec's),
    that distribution's release as the command's python has it, measured as graphbisect measured it (None when
    it cannot be told: the script then prints no version)."""
    if not options["cmd"]:
        raise CannotRun("repro_config.json has no command template (options.cmd)")
    package = options.get("package")
    if not package:
        return None
    import shutil

    env = command_env(options)
    python = shutil.which("python", path=env.get("PATH")) or shutil.which("python3", path=env.get("PATH"))
    if python is None:
        return None
    try:
        proc = subprocess.run([python, "-c", MEASURE, package], env=env, capture_output=True, text=True,
                              timeout=@MEASURE_TIMEOUT@, check=False)
        return json.loads(proc.stdout.strip().splitlines()[-1]).get("library_version")
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, AttributeError):
        return None


def command_env(options):
    """The environment the command runs with: this one, with venv='s bin/ first on PATH as graphbisect ran it."""
    env = dict(os.environ)
    venv = options.get("venv") or ""
    if venv:
        folder = os.path.abspath(os.path.expanduser(venv))
        scripts = os.path.join(folder, "Scripts" if os.name == "nt" else "bin")
        if not os.path.isdir(scripts):
            raise CannotRun(f"the target's environment {folder} is not here (no {os.path.basename(scripts)}/)")
        env["PATH"] = os.pathsep.join(p for p in (scripts, env.get("PATH")) if p)
        env["VIRTUAL_ENV"] = folder
        env.pop("PYTHONHOME", None)
    return env


def load_target(model_path, options):
    """The command template of the spec; {model}, {inputs} and {outputs} are filled in at run; the environment it
    runs with (venv=: its bin/ first on PATH, as graphbisect ran it)."""
    return model_path, options["cmd"], options["shell"], options.get("typed", False), command_env(options)


def run_target(target, inputs, output_names):
    """Write the inputs to an .npz, run the command (from the current directory), read its outputs .npz."""
    import shlex

    model_path, template, shell, typed, env = target
    with tempfile.TemporaryDirectory(prefix="repro-command-") as tmp:
        paths = {"model": str(model_path), "inputs": os.path.join(tmp, "inputs.npz"),
                 "outputs": os.path.join(tmp, "outputs.npz")}
        save_arrays(paths["inputs"], inputs, typed)
        if shell:
            command = template.format(**{k: shlex.quote(v) for k, v in paths.items()})
        else:
            command = [part.format(**paths) for part in shlex.split(template)]
        proc = subprocess.run(command, shell=shell, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                              check=False)
        stderr = proc.stderr.decode("utf-8", errors="replace")
        sys.stderr.write(stderr)
        why = cannot_run(proc.returncode, stderr)
        if why is not None:  # not the target failing: the program is missing or was called wrongly here
            raise CannotRun(f"the target's command cannot run here ({why}): {template}")
        if proc.returncode != 0:
            status = (f"was killed by signal {signal.Signals(-proc.returncode).name} ({-proc.returncode})"
                      if proc.returncode < 0 else f"exited with code {proc.returncode}")
            tail = "\n".join(stderr.strip().splitlines()[-20:])[-4000:]
            # the tail as a second paragraph, as graphbisect's runtime writes it: the first is the cause
            raise CommandFailed(f"command {status}" + (f"\n\n{tail}" if tail else ""))
        if "{outputs}" not in template:  # a check (graphbisect's check mode): exit 0 is the verdict, no outputs
            return {}
        if not os.path.isfile(paths["outputs"]):
            raise CommandFailed("command exited 0 but wrote no outputs file outputs.npz (the {outputs} path)")
        return load_arrays(paths["outputs"])


CANNOT_RUN_CODES = @CANNOT_RUN_CODES@
CANNOT_OPEN = re.compile(@CANNOT_OPEN@, re.MULTILINE)
USAGE = re.compile(@USAGE@, re.MULTILINE | re.IGNORECASE)


def cannot_run(returncode, stderr):
    """Why the exit status and stderr mean the program could not run at all (None: it ran), as graphbisect
    judged its runs: a missing program is not the target's failure, reproduced or different."""
    if returncode in CANNOT_RUN_CODES:
        return f"exit {returncode}: the command {CANNOT_RUN_CODES[returncode]}"
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if returncode == 2 and USAGE.search(stderr):
        return f"exit 2, a usage error: {last}"
    if returncode == 2 and CANNOT_OPEN.search(last):
        return f"exit 2: {last}"
    return None


def save_arrays(path, arrays, typed=False):
    """An .npz for any tensor names (numpy's savez rejects some, e.g. 'file'). A tensor of a type numpy lacks
    (bfloat16, float8, int4) is written as graphbisect writes it for a typed=1 command: its raw bits or
    values plus an entry in the member __values__.json; without typed=1 it is refused, as graphbisect does
    (a program reading the .npz with plain numpy would take the stored integers as the values)."""
    import zipfile

    described = {}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            value = np.asanyarray(value)
            code = extension_code(value)
            if code:
                if not typed:
                    raise NotImplementedError(f"command input {name!r} of type {ELEM_TYPES[code][0]} is not "
                                              "supported: add typed=1 if the program reads __values__.json")
                value = value.view(STORAGE[code]) if ELEM_TYPES[code][1] else value.astype(STORAGE[code])
                described[name] = {"file": f"{name}.npy", "dtype": value.dtype.str, "shape": list(value.shape),
                                   "elem_type": code}
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)
        if described:
            zf.writestr("__values__.json", json.dumps({"version": 1, "values": described}))

'''


# graphbisect's own rule (graphbisect.backends.command.cannot_run) and measurement of package= (_MEASURE), their
# values written into the script
_CODE = (_COMMAND_CODE.replace("@CANNOT_RUN_CODES@", repr(_CANNOT_RUN_CODES))
         .replace("@CANNOT_OPEN@", repr(_CANNOT_OPEN.pattern)).replace("@USAGE@", repr(_USAGE.pattern))
         .replace("@MEASURE@", repr(_MEASURE)).replace("@MEASURE_TIMEOUT@", repr(MEASURE_TIMEOUT)))

BACKEND = ReproBackend("command", "the command of the spec (no Python library)", None, _command_options, _CODE,
                       {"cmd": COMMAND_PROGRAM, "shell": ANY, "typed": ANY, "venv": COMMAND_ENVIRONMENT,
                        "package": ANY})
