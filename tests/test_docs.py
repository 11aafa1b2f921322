"""The README a newcomer reads in ten minutes, and documents that are references, not diaries (issue 38).

The README stays short (≤ 250 lines) and has a section for every command the CLI has; docs/architecture.md is
the current design in ≤ 400 lines; every relative link reaches a file; no document has dated section headings
or tells which issue of this project a thing came from (a project's documents describe it as it is; its
history is in git). benchmarks/README.md is one section per benchmark script, whose tables name, on every
row, the command that regenerates it and the commit it was measured at.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from graphbisect.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
BENCHMARKS = ROOT / "benchmarks" / "README.md"
DOCS = sorted([README, BENCHMARKS, ROOT / "examples" / "README.md", *(ROOT / "docs").rglob("*.md")])
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md is {lines} lines: move the detail to docs/guide/"


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_the_readme_has_a_section_per_command(command: str) -> None:
    assert re.search(rf"^### `{command}`", README.read_text(), re.M), f"README.md has no section for `{command}`"


def readme_section(text: str, command: str) -> str:
    """The text of the README's ``### `command` `` section, up to the next heading."""
    return re.split(r"^#", re.split(rf"^### `{command}`", text, flags=re.M)[1], flags=re.M)[0]


#: ``backends`` only lists; its exit codes are the general ones (0, or 2 for a usage error).
_LISTING = {"backends"}


@pytest.mark.parametrize("command", [c.name for c in COMMANDS if c.name not in _LISTING])
def test_each_command_section_says_its_exit_codes(command: str) -> None:
    assert re.search(r"\bexit\b.*\b[01]\b", readme_section(README.read_text(), command), re.S | re.I), \
        f"README.md's `{command}` section does not say what its exit codes mean"


def readme_command_lines(text: str) -> list[str]:
    """Every ``graphbisect ...`` line of the README's bash blocks, without its comment."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)
    found = [part.split("  #")[0].strip() for block in blocks for line in block.splitlines()
             for part in line.split("&&")]
    return [line for line in found if line.startswith("graphbisect ")]


def test_every_command_the_readme_shows_parses() -> None:
    """A newcomer copies them: each is a command with flags the CLI has (argparse exits 2 on any other)."""
    from graphbisect.cli.main import build_parser

    lines = readme_command_lines(README.read_text())
    assert len(lines) >= 15, lines
    for line in lines:
        words = [("onnxruntime" if word == "SPEC" else word) for word in shlex.split(line)[1:]]  # a placeholder
        try:
            build_parser(words[0]).parse_args(words)
        except SystemExit as exc:
            raise AssertionError(f"README.md shows a command the CLI refuses: {line}") from exc


@pytest.mark.parametrize("document", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_a_file(document: Path) -> None:
    missing = [target for target in _LINK.findall(document.read_text())
               if "://" not in target and not target.startswith("mailto:")
               and not (document.parent / target).exists()]
    assert not missing, f"{document.relative_to(ROOT)} links to what is not there: {missing}"


@pytest.mark.parametrize("document", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_section_headings(document: Path) -> None:
    dated = [line for line in document.read_text().splitlines()
             if line.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"{document.relative_to(ROOT)} has dated headings: {dated[:3]}"


def test_the_architecture_is_short() -> None:
    lines = ARCHITECTURE.read_text().count("\n")
    assert lines <= 400, f"docs/architecture.md is {lines} lines: it is the current design, not its history"


#: "issue 38", "Issues 25 and 27", "issue #12": this project's issues. Another project's are linked by name
#: (onnxruntime#30513, iree-org/iree/issues/24230) and stay.
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.I)


def issue_references(text: str) -> list[str]:
    """The lines of ``text`` that name an issue of this project by number."""
    return [line.strip() for line in text.splitlines() if _ISSUE.search(line)]


@pytest.mark.parametrize("document", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_history(document: Path) -> None:
    found = issue_references(document.read_text())
    assert not found, f"{document.relative_to(ROOT)} tells which issue a thing came from (git has it): {found[:3]}"


_COMMAND = re.compile(r"^- `(c\d+)`: `", re.M)
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def benchmark_table_problems(text: str) -> list[str]:
    """What breaks the convention of benchmarks/README.md: every table sits in a ``## `script` `` section with
    a ``Machine:`` line above it and has the columns **Regenerate** (a key of the section's ``- `cN`: `command` ``
    list) and **Measured at** (a commit), filled on every row. Dated headings are checked with every document."""
    problems = []
    for section in re.split(r"^(?=## )", text, flags=re.M):  # the text above the first section too
        title = section.splitlines()[0] if section.strip() else "(top)"
        commands = set(_COMMAND.findall(section))
        lines = section.splitlines()
        header: list[str] | None = None
        for number, line in enumerate(lines):
            if not line.startswith("|"):
                header = None
                continue
            if header is None:
                header = _cells(line)
                if "Regenerate" not in header or "Measured at" not in header:
                    problems.append(f"{title}: a table without the Regenerate and Measured at columns: {line[:80]}")
                    header = []
                if not any(earlier.startswith("Machine:") for earlier in lines[:number]):
                    problems.append(f"{title}: a table with no Machine: line above it")
                continue
            if not header or _SEPARATOR.match(line.strip()):
                continue
            row = dict(zip(header, _cells(line), strict=False))
            if row.get("Regenerate", "") not in commands:
                problems.append(f"{title}: a row whose Regenerate is not a command of the section: {line[:80]}")
            if not _COMMIT.fullmatch(row.get("Measured at", "")):
                problems.append(f"{title}: a row without the commit it was measured at: {line[:80]}")
    return problems


def test_each_benchmark_figure_names_its_command_and_commit() -> None:
    problems = benchmark_table_problems(BENCHMARKS.read_text())
    assert not problems, "benchmarks/README.md:\n" + "\n".join(problems)


def test_each_benchmark_script_has_a_section() -> None:
    """Helpers start with ``_``; ``make_*.py`` builds a model for a benchmark."""
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")
               if not p.name.startswith(("_", "make_"))}
    titles = "\n".join(re.findall(r"^## .*$", BENCHMARKS.read_text(), re.M))
    assert not {s for s in scripts if f"`{s}`" not in titles}, "benchmarks/README.md has no section for them"


def test_the_commits_named_exist() -> None:
    """A figure's commit is one of this repository's (not checked in a shallow clone or without git)."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    shallow = subprocess.run([git, "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True, check=False)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("a shallow clone does not hold the history")
    text = BENCHMARKS.read_text()
    named = sorted(set(re.findall(r"\| ([0-9a-f]{7,40}) \|", text))
                   | set(re.findall(r"measured at ([0-9a-f]{7,40})", text)))
    found = subprocess.run([git, "cat-file", "--batch-check"], cwd=ROOT, capture_output=True, text=True, check=True,
                           input="".join(f"{c}^{{commit}}\n" for c in named)).stdout.splitlines()
    missing = [commit for commit, answer in zip(named, found, strict=True) if answer.endswith("missing")]
    assert named and not missing, f"benchmarks/README.md names commits this repository lacks: {missing}"


def test_the_checks_can_fail() -> None:
    """Each convention above, broken once, is found."""
    assert issue_references("fixed in issue 14\nsee Issues 25 and 27\nonnxruntime#30513 stays") == [
        "fixed in issue 14", "see Issues 25 and 27"]
    good = ("## `x_bench.py`\n\n- `c1`: `python benchmarks/x_bench.py`\n\nMachine: 2 cores, quiet.\n\n"
            "| case | s | Regenerate | Measured at |\n|---|---:|---|---|\n| a | 1.0 | c1 | abc1234 |\n")
    assert benchmark_table_problems(good) == []
    broken = {
        "no command": good.replace("| a | 1.0 | c1 |", "| a | 1.0 | |"),
        "an unknown command": good.replace("| a | 1.0 | c1 |", "| a | 1.0 | c2 |"),
        "no commit": good.replace("abc1234", "today"),
        "no columns": good.replace("| Regenerate | Measured at |", "| x | y |"),
        "no machine": good.replace("Machine: 2 cores, quiet.", ""),
        "a table above the sections": "| s | Regenerate | Measured at |\n|---|---|---|\n| 1.0 | c1 | abc1234 |\n\n"
                                      + good,
    }
    for what, text in broken.items():
        assert benchmark_table_problems(text), what
