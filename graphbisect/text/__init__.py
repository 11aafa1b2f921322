"""What graphbisect's words say about names and files: one rule for every line it prints and every report it writes.

* :mod:`~graphbisect.text.printable` — names from files escaped for a terminal line; counts agreed with nouns;
* :mod:`~graphbisect.text.shareable` — a reporter's files by name, never where they live.

Standard library only (``repro.py`` embeds :mod:`~graphbisect.text.printable`'s text; ``artifacts/environment.py``
is loaded by path in interpreters without onnx). This package re-exports nothing: import from its modules.
"""
