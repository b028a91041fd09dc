"""The two lines around the panes, as Rich Text made from the Session: the header (host, refresh, the moment on
screen, REC, troubled sources) and the hint line (the first hint the line may show, cut to fit)."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

from dltop.fmt import human_duration, printable
from dltop.hints import Hint
from dltop.model import Snapshot
from dltop.playhead import Replay
from dltop.session import Session

HINT_LINES = 2  # the current tab's own hint; another tab's gets one line (it must not push this tab's off)
HINT_STYLES = {"critical": "bold red", "warn": "bold yellow", "info": "bold"}


def hms(ts: float) -> str:
    """A time of day as the header shows it."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def header_text(session: Session, snap: Snapshot) -> Text:
    """The header for the moment `snap` on screen."""
    t = Text()
    t.append("dltop", "bold")
    t.append(f" · {printable(snap.host)}")
    if snap.uptime_s is not None:
        t.append(f" · up {human_duration(snap.uptime_s)}")
    if not session.replay:
        t.append(f" · every {session.settings.refresh_s:g}s")
    t.append(" · ")
    t.append_text(_when(session, snap))
    if session.recorder is not None:
        t.append("  ● REC", "bold red")
    for s in snap.sources.values():
        if s.error:
            t.append(f"  ⚠ {s.name}: {printable(s.error)}", "bold yellow")
    if session.settings.read_only:
        t.append("  read-only", "dim")
    return t


def _when(session: Session, snap: Snapshot) -> Text:
    """The moment on screen: its time live; "PAUSED 14:05:13 (−2m10s)" behind live; "REPLAY name 14:05:13 ×10 ▶"
    in a replay."""
    clock = hms(snap.ts)
    head = session.head
    if isinstance(head, Replay) and session.recorded is not None:
        out = Text.assemble(("REPLAY", "bold magenta"), f" {printable(session.recorded.name)} {clock} ×{head.speed} ",
                            ("▶" if head.playing else "⏸", "bold"))
        gap = session.recorded.gap_before(snap.ts)
        after = session.recorded.gap_after(snap.ts)
        if gap:  # the sample before this one is far back: the screen crossed a hole in the recording
            out.append(f"  after a gap of {human_duration(gap)}", "bold yellow")
        elif after:  # the last sample before a hole: what is shown stays on screen through it
            out.append(f"  before a gap of {human_duration(after)}", "bold yellow")
        return out
    if head.at is None:
        return Text(clock)
    behind = session.history[-1].ts - snap.ts if session.history else 0.0
    return Text.assemble(("PAUSED", "bold reverse"), f" {clock} (−{human_duration(behind)})")


def hint_text(hints: list[Hint], own: bool, width: int, console: Any) -> Text:
    """The hint line: the first of `hints`, its fix, how many more; two lines for the tab's `own` hint, one for
    another tab's (it must not cost this tab two of its 24 rows)."""
    h = hints[0]
    style = HINT_STYLES[h.severity]
    t = Text.assemble(("! " if h.severity != "info" else "i ", style), (printable(h.text), style))
    if h.fix:
        t.append(f" — {printable(h.fix)}", "italic")
    t.append(f"  (+{len(hints) - 1} more, see ?)" if len(hints) > 1 else "", "dim")
    return fit_lines(t, width, HINT_LINES if own else 1, console)


def fit_lines(t: Text, width: int, lines: int, console: Any) -> Text:
    """`t` cut to `lines` lines of `width`, ending in '… ? shows all' when cut: the hint line never grows into the
    pane (whose status lines it would push off screen)."""
    wrapped = t.wrap(console, width)
    if len(wrapped) <= lines:
        return t
    tail = " … ? shows all"
    kept = Text("\n").join(wrapped[:lines])
    kept.truncate(len(kept) - len(wrapped[lines - 1]) + max(0, width - len(tail) - 2))
    kept.rstrip()
    kept.append(tail, "dim")
    return kept
