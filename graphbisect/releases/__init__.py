"""Releases of a backend package as a search axis: which exist (:mod:`.index`), one cached environment per
release (:mod:`.environments`), and where a list of them changes (:mod:`.search`). The workflow that runs a
bundle on them is :mod:`graphbisect.workflows.releases`; ``graphbisect.releases`` (the name) is the API function.

Imports only the standard library here: ``import graphbisect`` imports this package first.
"""
