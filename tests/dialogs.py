"""What a dialog shows, read from its widgets (the public face a user sees), not from the screen's own fields."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static


def confirm_shown(screen: Any) -> tuple[str, str, bool]:
    """A ConfirmScreen's title, body, and whether it has a yes to press (a refusal has none)."""
    title = str(screen.query_one("#confirm-title", Static).render())
    body = str(screen.query_one("#confirm-body", Static).render())
    return title, body, bool(screen.query("#confirm-yes"))


def help_rows(screen: Any) -> list[tuple[str, str]]:
    """The HelpScreen's (key, label) rows in the order listed: its key table is two columns of pairs."""
    table = screen.query_one("#help-keys", Static).content
    cols = [[str(c) for c in col.cells] for col in table.columns]
    left = list(zip(cols[0], cols[1], strict=True))
    right = list(zip(cols[2], cols[3], strict=True))
    return [(k, label.rstrip()) for k, label in [*left, *right] if k or label.strip()]
