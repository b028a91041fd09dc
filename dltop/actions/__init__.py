"""Actions that change the system (warm, evict, lock a dataset): cancellable, with progress, guarded.

Called by TUI key bindings and CLI subcommands, never by sources.
"""
