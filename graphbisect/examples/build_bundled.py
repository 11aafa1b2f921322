"""Regenerate the bundled example: ``python -m graphbisect.examples.build_bundled [--out DIR]``.

Writes ``layernorm_bug.onnx`` and ``layernorm_bug_inputs.npz`` next to :mod:`graphbisect.examples.bundled`
(or into ``DIR``). The output is deterministic: rerunning it on any supported onnx/numpy version gives the
same bytes, which ``tests/examples/test_examples.py`` checks against the shipped files.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from graphbisect.examples.bundled import write_example

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--out`` and write both files; log where they went."""
    parser = argparse.ArgumentParser(prog="python -m graphbisect.examples.build_bundled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder to write to (default: the package)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in write_example(args.out):
        logger.info("wrote %s (%d bytes)", path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
