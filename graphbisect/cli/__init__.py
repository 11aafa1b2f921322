"""The ``graphbisect`` command: each command module parses its arguments (checked at parse time by the argument
types of ``common.py``, with the ranges of :mod:`graphbisect.settings.options`), calls the workflows and prints.

The CLI and :mod:`graphbisect.api` are two siblings over :mod:`graphbisect.workflows`: no command goes through the
API (``tests/test_structure.py`` holds it), so an option is parsed and checked on one road per front end.
"""
