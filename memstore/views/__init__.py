"""Derived views of a session: search chunks, the memory view, the progress ledger."""
