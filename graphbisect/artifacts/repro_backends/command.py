"""The ``command`` section of ``repro.py``: the spec's external command, arrays in and out as files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import ReproBackend
from graphbisect.backends.worker import option_flag


def _command_options(options: Mapping[str, str]) -> dict[str, Any]:
    return {"cmd": options.get("cmd", ""), "shell": option_flag(options, "shell")}


_COMMAND_CODE = r'''
# --------------------------------------------------------------------- the target: an external command
class CommandFailed(RuntimeError):
    """The command exited non-zero or wrote no outputs (same class name and first line as graphbisect's)."""


def import_library(options):
    """Nothing to import for an external command (so no version): check there is a command template."""
    if options["cmd"]:
        return None
    raise CannotRun("repro_config.json has no command template (options.cmd)")


def load_target(model_path, options):
    """The command template of the spec; {model}, {inputs} and {outputs} are filled in at run."""
    return model_path, options["cmd"], options["shell"]


def run_target(target, inputs, output_names):
    """Write the inputs to an .npz, run the command (from the current directory), read its outputs .npz."""
    import shlex

    model_path, template, shell = target
    with tempfile.TemporaryDirectory(prefix="repro-command-") as tmp:
        paths = {"model": str(model_path), "inputs": os.path.join(tmp, "inputs.npz"),
                 "outputs": os.path.join(tmp, "outputs.npz")}
        save_arrays(paths["inputs"], inputs)
        if shell:
            command = template.format(**{k: shlex.quote(v) for k, v in paths.items()})
        else:
            command = [part.format(**paths) for part in shlex.split(template)]
        proc = subprocess.run(command, shell=shell, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        stderr = proc.stderr.decode("utf-8", errors="replace")
        sys.stderr.write(stderr)
        if proc.returncode != 0:
            status = (f"was killed by signal {signal.Signals(-proc.returncode).name} ({-proc.returncode})"
                      if proc.returncode < 0 else f"exited with code {proc.returncode}")
            tail = "\n".join(stderr.strip().splitlines()[-20:])[-4000:]
            raise CommandFailed(f"command {status}" + (f"\n{tail}" if tail else ""))
        if not os.path.isfile(paths["outputs"]):
            raise CommandFailed("command exited 0 but wrote no outputs file outputs.npz (the {outputs} path)")
        return load_arrays(paths["outputs"])


def save_arrays(path, arrays):
    """An .npz for any tensor names (numpy's savez rejects some, e.g. 'file')."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)

'''


BACKEND = ReproBackend("command", "the command of the spec (no Python library)", None, _command_options,
                       _COMMAND_CODE)
