"""SVG snapshots of each pane at 80×24 and 120×40, from Snapshots recorded on a real machine.

Update after a deliberate change with `pytest tests/test_snapshots.py --snapshot-update`, and look at the report.
"""

from __future__ import annotations

import pytest

from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from tests.conftest import load_session

SIZES = [(80, 24), (120, 40)]


def _tab(app: DltopApp, pane_id: str) -> str:
    return str([p.PANE_ID for p in app.panes].index(pane_id) + 1)


def _open(pane_id: str, *keys: str):
    """Show a pane's tab, then draw it again once its layout has settled."""

    async def run(pilot) -> None:
        await pilot.press(_tab(pilot.app, pane_id))
        await pilot.pause()
        pilot.app.show()  # as the next tick would: the picture is the pane at its settled layout
        await pilot.pause()
        await pilot.press(*keys)

    return run
# The moment of the recorded session when writeback starts: Dirty high, Writeback non-zero, the disk busy.
AT = 20


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_page_cache_pane(snap_compare, size: tuple[int, int]) -> None:
    session = load_session()
    app = DltopApp(ListFeed(session[: AT + 1], start=AT))
    assert snap_compare(app, terminal_size=size, run_before=_open("pagecache"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help_screen(snap_compare, size: tuple[int, int]) -> None:
    session = load_session()
    app = DltopApp(ListFeed(session[: AT + 1], start=AT))
    assert snap_compare(app, terminal_size=size, run_before=_open("pagecache", "question_mark"))
