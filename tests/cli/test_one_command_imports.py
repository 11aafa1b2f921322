"""A run of one command imports that command's module only: the nine others' imports are not paid for."""

from __future__ import annotations

import ast
import subprocess
import sys

from graphbisect.cli.main import COMMANDS, chosen_command

_IMPORTED = """
import sys
from graphbisect.cli.main import COMMANDS, main
code = main(sys.argv[1:])
print(sorted(c.name for c in COMMANDS if c.module in sys.modules))
"""


def _commands_imported(*argv: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _IMPORTED, *argv], check=True, capture_output=True, text=True,
                          timeout=120)
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_one_command_imports_its_module_alone() -> None:
    assert _commands_imported("-v", "backends", "--help") == ["backends"]
    assert _commands_imported("compare", "--help") == ["compare"]


def test_the_top_level_help_still_lists_every_command() -> None:
    imported = _commands_imported("--help")
    assert imported == sorted(c.name for c in COMMANDS)  # None chosen: the whole parser, as before


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert chosen_command(["-v", "-v", "reduce", "m.onnx", "--target", "compare"]) == "reduce"
    assert chosen_command(["m.onnx"]) is None and chosen_command([]) is None and chosen_command(["--version"]) is None
