"""What a user may set: the declared range of every option, checked the same from Python and from the CLI.

:mod:`~graphbisect.settings.options` is a leaf below every room that has options (the engine's budget, the
executors, the backends' specs, input generation, the workflows, the CLI's argument types), so it lives in a
room of its own rather than in any of them. This package re-exports nothing: import from its modules.
"""
