"""The documents generated from the code: :mod:`~graphbisect.docs.api_doc` renders ``docs/api.md``.

Run ``python -m graphbisect.docs.api_doc``. Nothing in graphbisect imports this room; ``tests/test_api.py`` keeps
the page in sync with the docstrings.
"""
