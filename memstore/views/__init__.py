"""Derived views of a session, each regenerable from its log: the search chunks and file changes
(derived tables of the session index), the memory view and the trajectory (files in
``derived/``, see :mod:`memstore.views.registry`), and the progress ledger.

Importing this package registers the built-in views.
"""

from . import chunks, memory_view, trajectory  # noqa: F401  (each registers itself)
