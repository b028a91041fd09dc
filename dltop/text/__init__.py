"""Plain text shared by a CLI command and a TUI pane (below both: neither imports the other)."""
