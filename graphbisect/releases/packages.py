"""The packages ``graphbisect releases`` can install: one table (:data:`PACKAGES`), which drives the command's
``--package`` choices, the environments made (:mod:`.environments`) and the docs.

A :class:`Recipe` says what a release's environment holds: the package's distributions at the release's version
(IREE's compiler and runtime are two, installed as a pair at the same version, so a release is one that both
have), and what a graphbisect worker of that backend needs beside them, the same for every release so that the
release is the only thing that changes between two runs:

* ``numpy<2`` where this Python has numpy 1 wheels (< 3.13): ONNX Runtime releases before 1.19 were built against
  numpy 1, and one numpy for every release of a range leaves the release the only thing that changes; a release's
  own narrower bound (OpenVINO 2024.6.0 asks ``numpy<2.2.0``) is the installer's to honour within it;
* ``onnx`` for IREE, whose worker reads the model with onnx before its importer turns it into MLIR: pinned, so
  that the importer's input is the same for every IREE release.

A release's worker reports its library's version as the library says it (``2024.0.0-14509-34caeefd078-
releases/2024/0`` for OpenVINO): :meth:`Recipe.reports` reads the release in it.

**Any other package**, with a ``command:`` target: :func:`recipe_of` makes its recipe, the package at the release
and ``numpy`` beside it (the one the installer picks for that release: the command's program reads and writes
``.npz`` files), run by the ``command`` backend with the environment first on its ``PATH``.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from graphbisect.errors import InputError
from graphbisect.releases.index import index_versions, release_key

__all__ = ["COMMAND", "PACKAGES", "Recipe", "recipe_of", "release_versions"]

log = logging.getLogger(__name__)

_NUMPY = ("numpy<2",) if sys.version_info < (3, 13) else ("numpy",)


@dataclass(frozen=True)
class Recipe:
    """How to install a release of ``package`` (the name ``--package`` takes and environments are named by): its
    ``distributions`` at the release's version, ``extras`` beside them; the ``backends`` (spec names) it runs."""

    package: str
    backends: tuple[str, ...]
    distributions: tuple[str, ...]
    #: what beside the release a worker needs, for this Python
    extras: tuple[str, ...] = ()
    #: the spec each release runs on a model when none is named
    target: str = ""
    #: one line for the docs and ``--help``
    summary: str = ""

    def requirements(self, version: str) -> list[str]:
        """The requirements of the environment of ``version``.

        Example:
            >>> PACKAGES["iree"].requirements("3.13.0")[:2]
            ['iree-base-compiler==3.13.0', 'iree-base-runtime==3.13.0']
        """
        return [*(f"{dist}=={version}" for dist in self.distributions), *self.extras]

    def reports(self, version: str, library_version: str) -> bool:
        """Whether a worker reporting ``library_version`` runs release ``version``: the same release number, with
        what a library appends after it (OpenVINO's build number and branch, a ``+local`` tag) left out.

        Example:
            >>> PACKAGES["openvino"].reports("2024.0.0", "2024.0.0-14509-34caeefd078-releases/2024/0")
            True
            >>> PACKAGES["onnxruntime"].reports("1.20.1", "1.22.1")
            False
        """
        head = library_version.strip().split("-", 1)[0].split("+", 1)[0]
        try:
            return release_key(head) == release_key(version)
        except ValueError:
            return library_version.strip() == version


#: The packages ``graphbisect releases`` can install, by the name ``--package`` takes.
PACKAGES: Mapping[str, Recipe] = {recipe.package: recipe for recipe in (
    Recipe("onnxruntime", ("onnxruntime",), ("onnxruntime",), _NUMPY, "onnxruntime:opt_level=all",
           "ONNX Runtime, the CPU wheel"),
    Recipe("onnxruntime-gpu", ("onnxruntime",), ("onnxruntime-gpu",), _NUMPY, "onnxruntime:opt_level=all",
           "ONNX Runtime, the GPU wheel (CUDA's libraries are the machine's; its CPU provider runs anywhere)"),
    Recipe("openvino", ("openvino",), ("openvino",), _NUMPY, "openvino", "OpenVINO"),
    Recipe("iree", ("iree",), ("iree-base-compiler", "iree-base-runtime"), (*_NUMPY, "onnx==1.17.0"), "iree",
           "IREE: iree-base-compiler and iree-base-runtime at the same version, with onnx 1.17.0"),
    Recipe("paddlepaddle", ("paddle",), ("paddlepaddle",), _NUMPY, "paddle", "Paddle Inference, the CPU wheel"),
    Recipe("onnx", ("reference",), ("onnx",), _NUMPY, "reference", "onnx, whose onnx.reference is the reference"),
)}


#: A distribution's name (PEP 508): what ``--package`` may name outside the table (it becomes a folder's name).
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
#: The backend that runs any package's release: a ``command:`` target, its environment first on ``PATH``.
COMMAND = "command"


def recipe_of(package: str, *, command: bool = False) -> Recipe:
    """The :class:`Recipe` of ``package``: the table's, else, for a ``command`` target, one of its own (the package
    alone at each release, ``numpy`` beside it). :class:`InputError` for a package outside the table without a
    ``command:`` target, or a name that is not a distribution's.

    Example:
        >>> recipe_of("tflite-runtime", command=True).requirements("2.14.0")
        ['tflite-runtime==2.14.0', 'numpy']
    """
    if package in PACKAGES:
        return PACKAGES[package]
    if not _DISTRIBUTION.match(package):
        raise InputError(f"package {package!r} is not a distribution's name", hint="e.g. package='onnxruntime'",
                         cli_hint="e.g. --package onnxruntime")
    if not command:
        raise InputError(f"graphbisect releases has no backend of its own for {package!r} (it has for: "
                         f"{', '.join(PACKAGES)}): another package's releases run a command: target",
                         hint=f"--target 'command:cmd=python run.py {{model}} {{inputs}} {{outputs}}' (your program, "
                         f"run by each release's environment: python and {package}'s scripts are that "
                         "release's), or --package one of those")
    return Recipe(package, (COMMAND,), (package,), ("numpy",), "",
                  f"{package}, run by a command: target with each release's environment first on PATH")


def release_versions(recipe: Recipe, *, pre: bool = False) -> list[str]:
    """The releases the package index has of every one of ``recipe``'s distributions for this interpreter (for
    IREE, the versions both the compiler and the runtime have), in the index's order. Raises
    :class:`InputError` as :func:`~graphbisect.releases.index.index_versions` does."""
    first, *others = recipe.distributions
    listed = index_versions(first, pre=pre)
    for dist in others:
        has = set(index_versions(dist, pre=pre))
        lacking = [v for v in listed if v not in has]
        if lacking:
            log.info("left out %s of %s: no %s of the same version", ", ".join(lacking), first, dist)
        listed = [v for v in listed if v in has]
    return listed
