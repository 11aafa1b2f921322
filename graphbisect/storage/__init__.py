"""The on-disk layer: how graphbisect writes, locks, packs and reads back its files.

* :mod:`~graphbisect.storage.atomic` — atomic file writes (a reader never sees a half-written file);
* :mod:`~graphbisect.storage.lockfile` — an exclusive lock on a folder, released by the kernel;
* :mod:`~graphbisect.storage.tempfolders` — temporary folders that name their owner process;
* :mod:`~graphbisect.storage.values` — every ONNX value type, in memory and as stored (``.npz``, entries);
* :mod:`~graphbisect.storage.packfile` — a run's values as one packed data file plus its index;
* :mod:`~graphbisect.storage.npyfile` — reading ``.npy`` files of known dtype and shape;
* :mod:`~graphbisect.storage.npzguard` — limits checked before an ``.npz`` is read;
* :mod:`~graphbisect.storage.onnxwire` — a model file's declared outputs, read from its bytes.
* :mod:`~graphbisect.storage.gcpause` — the garbage collector paused while a step makes thousands of lasting
  objects (a model's index, a table of statistics): the bottom of the house, so every layer uses it.

Every module here imports only the standard library, numpy and this room (and :mod:`graphbisect.errors`):
backend workers, maybe under another interpreter, use them. This package re-exports nothing: import from
its modules.
"""
