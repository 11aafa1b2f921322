"""Helpers shared by the benchmarks: sizes, aligned tables, JSON reports, the machine, memory and disk use.

The benchmarks print; graphbisect itself never does. Every benchmark takes ``--quick`` (a CI-size run of
under a minute), ``--full`` (bigger sizes) and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_DIR",
    "DirSize",
    "MemorySampler",
    "add_size_args",
    "describe_machine",
    "dir_size",
    "environment",
    "format_table",
    "median",
    "mib",
    "print_table",
    "write_json",
]

BENCH_DIR = Path(__file__).resolve().parent
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def add_size_args(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--full`` (mutually exclusive) and ``--json PATH``."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CI-size run (under a minute)")
    size.add_argument("--full", action="store_true", help="bigger sizes (much longer)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")


def format_table(header: Sequence[str], rows: Iterable[Sequence[object]], *, left: int = 1,
                 left_last: bool = False) -> str:
    """An aligned plain-text table; the first ``left`` columns (and the last with ``left_last``) are
    left-aligned, the others right-aligned.

    >>> print(format_table(["a", "n"], [["x", 1], ["yy", 22]]))
    a    n
    --  --
    x    1
    yy  22
    """
    text = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in text) for i in range(len(header))]

    lefts = {*range(left), *([len(header) - 1] if left_last else [])}

    def line(row: Sequence[str]) -> str:
        cells = [c.ljust(w) if i in lefts else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(text[0]), rule, *(line(row) for row in text[1:])])


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]], *, left: int = 1,
                left_last: bool = False, notes: Sequence[str] = ()) -> None:
    """Print ``title``, the table and its footnotes."""
    print(f"\n{title}\n")
    print(format_table(header, rows, left=left, left_last=left_last))
    for note in notes:
        print(f"  {note}")


def environment() -> dict[str, Any]:
    """The machine and library versions a result was measured with."""
    versions = {}
    for package in ("onnx", "onnxruntime", "polygraphy", "onnx_graphsurgeon", "numpy", "graphbisect"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "load_average": load, "versions": versions}


def describe_machine() -> str:
    """One line: cores, versions, and the load average (other work on the machine skews wall times)."""
    env = environment()
    v = env["versions"]
    load = "" if env["load_average"] is None else f", load average {env['load_average'][0]:.1f} at the end"
    return (f"{env['cpus']} cores, CPU only, Python {env['python']}, onnx {v['onnx']}, onnxruntime {v['onnxruntime']}, "
            f"polygraphy {v['polygraphy']}{load}")


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    """Write ``data`` plus the environment to ``path`` (nothing when it is None)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment(), **data}, indent=2, default=str) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20


@dataclass(frozen=True)
class DirSize:
    """Files in a folder tree: count, sum of their sizes, and the disk blocks they occupy."""

    files: int
    apparent_bytes: int
    disk_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"files": self.files, "apparent_bytes": self.apparent_bytes, "disk_bytes": self.disk_bytes}


def dir_size(path: Path) -> DirSize:
    """Size of every regular file under ``path`` (zero when it does not exist)."""
    files = apparent = disk = 0
    for root, _, names in os.walk(path):
        for name in names:
            stat = os.lstat(os.path.join(root, name))
            files += 1
            apparent += stat.st_size
            disk += stat.st_blocks * 512
    return DirSize(files, apparent, disk)


def _ppid_and_rss(pid: int) -> tuple[int, int] | None:
    """(parent pid, resident bytes) of a live process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[21]) * _PAGE  # fields[0] is the state; see proc(5)


class MemorySampler:
    """Samples the resident memory of a process (``root``, default this one) *plus all its descendants* every
    ``interval`` seconds.

    ``peak_bytes`` is the largest sum seen: the memory the whole process tree held at once (main process
    and backend worker processes). It is a sample, so a spike shorter than ``interval`` can be missed;
    ``resource.getrusage`` gives the exact peak of each process on its own. Sampling from *another* process
    (``root`` = a child's pid) is more faithful: a sampling thread inside the measured process waits for the
    GIL, so it misses spikes inside long C calls (a protobuf copy of gigabytes of weights).

    ``worker_peak_bytes`` is the largest high-water mark (``VmHWM``) of a descendant of ``root``, as last
    read while it lived (exact up to its last ``interval``; the *last* reading, because between fork and exec
    a child still reports its parent's memory). Why not ``getrusage(RUSAGE_CHILDREN)`` for workers: a child
    started by fork or vfork and exec inherits the parent's high-water mark into its ``ru_maxrss``, so a
    worker of a 3 GiB main process reports at least 3 GiB. Linux only (reads /proc); elsewhere the peaks
    stay 0.

    ``cpu_seconds``: the CPU time the sampling thread spent (one pass over /proc costs ~1 ms on a machine with
    ~80 processes, ~10 % of a core at the default interval); a caller that reports the CPU time of its own
    process subtracts it, so a longer run is not charged for being watched longer.
    """

    def __init__(self, interval: float = 0.01, *, root: int | None = None) -> None:
        self.interval = interval
        self.root = root
        self.peak_bytes = 0
        self.samples = 0
        self.cpu_seconds = 0.0  # CPU time of the sampling thread itself (reading /proc), to subtract from a total
        self._high_water: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        if not os.path.isdir("/proc"):
            return
        root = self.root if self.root is not None else os.getpid()
        while not self._stop.is_set():
            rss = _tree_rss(root)
            self.peak_bytes = max(self.peak_bytes, sum(rss.values()))
            for pid in rss:
                if pid != root:
                    self._high_water[pid] = _high_water(pid) or self._high_water.get(pid, 0)
            self.samples += 1
            self.cpu_seconds = time.thread_time()
            self._stop.wait(self.interval)

    @property
    def worker_peak_bytes(self) -> int:
        """The largest last-read ``VmHWM`` of any descendant of ``root`` (0 when none was seen)."""
        return max(self._high_water.values(), default=0)


def _high_water(pid: int) -> int:
    """``VmHWM`` (peak resident bytes of the process's current image) of a live process; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _tree_rss(root: int) -> dict[int, int]:
    """Resident bytes of ``root`` and of every descendant (pid → bytes), from one pass over /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _ppid_and_rss(int(entry))
            if found is not None:
                parents[int(entry)], rss[int(entry)] = found
    tree, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return {pid: rss.get(pid, 0) for pid in tree}
