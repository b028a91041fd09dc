"""The Session as plain Python (no Textual): the opening tab, the hints and their mute/snooze, the action gate, the
edits of what is watched, the history and the moment on screen, and the messages it says."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dltop import hints as hint_rules
from dltop.config import Settings
from dltop.hints import SNOOZE_S, Hint
from dltop.hints.base import wanted
from dltop.model import Snapshot, Unavailable
from dltop.model.actions import ActionEvent, ActionPlan
from dltop.model.gpu import GpuDevice
from dltop.playhead import Live, Paused, Replay
from dltop.sampler import ListFeed
from dltop.session import Session, next_refresh
from dltop.timeline import LiveEvent, Recorded
from tests.test_first_screen import _dataset, _snap

CACHE_HINT = Hint("cache-on-temporary-storage", "info", "compile cache under /tmp", fix="set a cache dir")
GPU_HINT = Hint("gpu-kv-pool-full", "info", "KV cache of m is 99.8% full")


@dataclass
class FakeRunner:
    """The action runner's face the Session uses: what it was asked, nothing run."""

    busy: Any = None
    locks: dict[str, int] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def held(self) -> dict[str, int]:
        return dict(self.locks)

    def locked(self) -> dict[str, int | None]:
        return dict(self.locks)

    def release(self, target: str) -> int:
        self.asked.append(("release", target))
        return self.locks.pop(target, 0)

    def plan(self, action: str, paths: list[str], **kw: Any) -> Any:
        self.asked.append(("plan", paths[0]))
        return type("Run", (), {"id": len(self.asked), "result": None})()

    def start(self, action: str, paths: list[str], **kw: Any) -> None:
        self.asked.append((action, paths[0]))


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _session(snaps: list[Snapshot] | None = None, settings: Settings | None = None, **kw: Any) -> Session:
    snaps = snaps or [_snap()]
    s = Session(ListFeed(snaps, start=len(snaps) - 1), settings or Settings(), runner=kw.pop("runner", FakeRunner()), **kw)
    s.open()
    return s


@pytest.mark.parametrize("case", ["no gpu", "no gpu, datasets", "gpus", "--tab", "cluster"])
def test_it_opens_on_the_tab_that_has_something(tmp_path: Path, case: str) -> None:
    # A machine without a GPU opened on the empty GPU tab, even as `dltop /data/x`.
    gpus: object = (GpuDevice(index=0, name="NVIDIA L40S"),) if case == "gpus" else ()
    datasets = _dataset(tmp_path) if case == "no gpu, datasets" else None
    settings = Settings(datasets=(str(tmp_path / "ds"),) if datasets else (), tab="cpu" if case == "--tab" else None,
                        prometheus="http://prom:9090" if case == "cluster" else None)
    session = _session([_snap(gpus=gpus, datasets=datasets)], settings)
    want = {"no gpu": "pagecache", "no gpu, datasets": "datasets", "gpus": "gpu", "--tab": "cpu",
            "cluster": "cluster"}[case]
    assert _opening(session, ["cluster", "gpu", "pagecache", "datasets", "cpu"]) == want
    assert not session.tabs.pending  # decided


def _opening(session: Session, tabs: list[str]) -> str | None:
    return session.tabs.switch(tabs, session.settings, session.history)


def test_the_tab_waits_for_the_gpu_source() -> None:
    feed = ListFeed([_snap(100.0, gpus=Unavailable("waiting for the first reading")),
                     _snap(101.0, gpus=(GpuDevice(index=0),))])
    session = Session(feed)
    session.open()
    tabs = ["gpu", "pagecache"]
    assert _opening(session, tabs) == "pagecache" and session.tabs.pending  # nothing known yet
    assert _opening(session, tabs) is None  # the same tab: no switch
    session.apply(feed.advance())  # NVML answers: GPUs are there
    assert _opening(session, tabs) == "gpu" and not session.tabs.pending
    # A user who picked a tab (a click on another one) ends the choosing.
    session = Session(ListFeed([_snap(100.0, gpus=Unavailable("waiting for the first reading"))]))
    session.open()
    assert _opening(session, tabs) == "pagecache"
    session.tabs.shown("cpu")
    assert not session.tabs.pending and _opening(session, tabs) is None


def test_a_snapshot_applied_twice_is_drawn_once_and_a_pause_keeps_within_the_history() -> None:
    snaps = [_snap(100.0 + i) for i in range(4)]
    session = _session(snaps[:1])
    assert not session.apply(snaps[0])  # the same object: nothing new
    for s in snaps[1:]:
        assert session.apply(s)
    session.head = Paused(100.0)
    session.history = type(session.history)(session.history, maxlen=2)  # a short history: the oldest leave
    session.apply(_snap(104.0))
    assert session.head == Paused(103.0)  # the moment paused on left the history: the oldest one kept
    frame = session.frame()
    assert frame is not None and frame[0][-1].ts == 103.0


def test_view_hands_the_moment_on_screen_and_the_actions_state(tmp_path: Path) -> None:
    runner = FakeRunner(locks={"/data/a": 4096})
    snaps = [_snap(100.0 + i) for i in range(3)]
    session = _session(snaps[:1], Settings(read_only=True, datasets=("/data/a",)), runner=runner)
    for s in snaps[1:]:
        session.apply(s)
    view = session.view()
    assert view is not None and view.snapshot is snaps[-1] and list(view.history) == snaps
    assert view.read_only and not view.replay and view.watched == ("/data/a",) and view.held == {"/data/a": 4096}
    session.head = Live().step(session.times(), -1)
    view = session.view()
    assert view is not None and view.snapshot.ts == 101.0 and view.replay and view.previous is not None


def test_a_replay_has_no_feed_and_opens_at_its_start() -> None:
    class Rec:
        meta = {"interval_s": 2.0}

        def __init__(self, snaps: list[Snapshot]) -> None:
            self.snaps = snaps

        def times(self) -> list[float]:
            return [s.ts for s in self.snaps]

        @property
        def first_ts(self) -> float:
            return self.snaps[0].ts

        @property
        def last_ts(self) -> float:
            return self.snaps[-1].ts

        def range(self, t0: float | None = None, t1: float | None = None) -> Any:
            return iter([s for s in self.snaps if (t0 is None or s.ts >= t0) and (t1 is None or s.ts <= t1)])

        def events(self, t0: float | None = None, t1: float | None = None) -> list[Any]:
            return []

    snaps = [_snap(100.0), _snap(102.0), _snap(110.0)]
    session = Session(None, recorded=Recorded(Rec(snaps), "rec", 102.0))
    session.open()
    assert session.replay and session.head == Replay(102.0, pos=102.0)
    assert session.refusal("warm") == "warm: this is a replay; nothing may change the system from here"
    session.read_now("datasets")  # nothing to read again: no error
    assert session.recorded.gap_before(110.0) == 8.0 and session.recorded.gap_before(102.0) == 0.0  # over 3 intervals of 2 s
    assert session.recorded.gap_after(102.0) == 8.0 and session.recorded.gap_after(100.0) == 0.0
    said = len(session.said)
    assert session.go_typed("103.5") == Replay(102.0, pos=102.0) and len(session.said) == said  # the next not yet due
    assert session.go_typed("105") == Replay(102.0, pos=102.0)  # b 105: inside the gap, and said so
    assert session.said[-1].text.startswith(f"{time.strftime('%H:%M:%S', time.localtime(105))} is inside a gap of 8s")
    assert session.said[-1].severity == "warning"
    noted = Session(None, recorded=Recorded(Rec(snaps), "rec", 102.0, "104 is inside a gap"))
    noted.open()  # replay -t 104: what the command found is said once on screen
    assert [s.text for s in noted.said] == ["104 is inside a gap"]
    assert session.end_text(1) == "the last sample of the recording"
    assert "this is a replay" in (session.mark_refusal() or "") and session.allows("events")


def test_the_gate_says_why_nothing_may_change_the_system() -> None:
    runner = FakeRunner()
    session = _session([_snap(100.0), _snap(101.0)], runner=runner)
    session.request("warm", "/data/a")
    assert runner.asked == [("plan", "/data/a")] and session.plans  # planned; its plan is confirmed when it comes
    session.head = Paused(100.0)
    session.request("evict", "/data/a")
    session.send_signal(object())  # type: ignore[arg-type]
    assert [s.text for s in session.said] == [
        "evict: paused on a past moment (space goes back to live); nothing may change the system from here",
        "signal: paused on a past moment (space goes back to live); nothing may change the system from here"]
    assert [s.severity for s in session.said] == ["warning", "warning"]
    view = session.view()  # the panes' greyed keys say the same reason, not "this is a replay" (paused live data)
    assert view is not None and view.frozen == "paused on a past moment (space goes back to live)"
    session.head = Live()
    assert (view := session.view()) is not None and view.frozen is None
    runner.busy = type("Run", (), {"action": "warm", "target": "/data/b"})()
    session.request("evict", "/data/a")
    assert session.said[-1].text == "warm /data/b is still running (Esc cancels)"
    runner.busy, runner.locks = None, {"/data/a": 10}
    session.request("lock", "/data/a")  # a lock on a locked target unlocks it
    assert runner.asked[-1] == ("release", "/data/a")
    read_only = _session(settings=Settings(read_only=True))
    assert read_only.refusal("clear") == "clear: dltop runs --read-only; nothing may change the system from here"


def test_a_finished_plan_is_confirmed_unless_its_dataset_was_unwatched() -> None:
    runner = FakeRunner()
    session = _session(settings=Settings(datasets=("/data/a",)), runner=runner)
    plan = ActionPlan(action="warm", target="/data/a/x", bytes=10, files=1, allowed=True)
    for target, want in (("/data/a/x", plan), ("/elsewhere", None)):
        session.plans[7] = type("Run", (), {"result": plan if target == "/data/a/x" else
                                            ActionPlan(action="warm", target=target, bytes=1, files=1, allowed=True)})()
        ev = ActionEvent(run_id=7, step="plan", phase="finished", action="warm", target=target, paths=(target,), ts=1.0,
                         outcome="ok")
        assert session.on_action(ev) == want and not session.plans
    session.start(plan)
    assert runner.asked[-1] == ("warm", "/data/a/x")
    failed = ActionEvent(run_id=8, step="run", phase="finished", action="warm", target="/data/a", paths=("/data/a",), ts=2.0,
                         outcome="error", message="no space")
    assert session.on_action(failed) is None and session.said[-1].text == "no space"
    assert session.said[-1].severity == "error" and session.action is failed
    assert [e.data["action"] for e in session.timeline.events()] == ["warm"]  # a live event, for v


def test_hints_muted_snoozed_and_the_tabs_own_first() -> None:
    clock = Clock()
    session = _session(settings=Settings(mute=("gpu-kv-pool-full",)), clock=clock)
    session.hints = [CACHE_HINT, GPU_HINT]
    assert session.line_hints("gpu") == [CACHE_HINT]  # muted in the config: off the line
    assert session.quieted.state("gpu-kv-pool-full") == "muted (config)"
    session.quieted.set("gpu-kv-pool-full", "")
    assert session.line_hints("gpu") == [GPU_HINT, CACHE_HINT]  # the tab's own first
    assert session.line_hints("caches") == [CACHE_HINT, GPU_HINT]
    session.quieted.set("cache-on-temporary-storage", "snoozed")
    assert session.quieted.state("cache-on-temporary-storage").startswith("snoozed until")
    assert session.line_hints("caches") == [GPU_HINT]
    assert session.help_hints("caches") == [GPU_HINT, CACHE_HINT]  # still listed in ?, after
    clock.now += SNOOZE_S + 1  # the snooze is over
    assert session.line_hints("caches") == [CACHE_HINT, GPU_HINT]
    session.quieted.set("gpu-kv-pool-full", "muted")
    assert session.quieted.state("gpu-kv-pool-full") == "muted (config)" and session.line_hints(None) == [CACHE_HINT]


def test_m_mutes_a_hint_for_its_subject_and_M_for_every_subject() -> None:
    # `m` on "training-stalled: pid 1234 ..." mutes the hint for that job; another job's stall stays on the line.
    clock = Clock()
    session = _session(settings=Settings(mute=("cache-growing",)), clock=clock)
    mine = Hint("training-stalled", "warn", "pid 1234: no step for 90s: stalled", subject="job uid 1000 job a")
    theirs = Hint("training-stalled", "warn", "bob's pid 99: no step for 80s: stalled", subject="job uid 1001 job b")
    grows = Hint("cache-growing", "warn", "Triton grew 2 GiB", subject="cache /home/u/.triton")
    session.hints = [mine, theirs, grows]
    q = session.quieted
    assert session.line_hints(None) == [mine, theirs]  # the config's mute = [ID]: every cache
    assert q.state(grows.id, grows.subject) == "muted (config) for every cache"
    q.set(mine.id, "muted", mine.subject)
    assert session.line_hints(None) == [theirs] and q.state(theirs.id, theirs.subject) == ""
    assert q.state(mine.id, mine.subject) == "muted for this job"
    q.set_kind(mine.id, True)  # M: every job
    assert session.line_hints(None) == [] and q.state(theirs.id, theirs.subject) == "muted for every job"
    q.set_kind(mine.id, False)  # M again: back, but for the job muted on its own
    assert session.line_hints(None) == [theirs]
    q.set(mine.id, "", mine.subject)  # m again: back
    assert session.line_hints(None) == [mine, theirs]
    q.set(theirs.id, "snoozed", theirs.subject)
    assert session.line_hints(None) == [mine] and q.state(theirs.id, theirs.subject).endswith("for this job")
    clock.now += SNOOZE_S + 1
    assert session.line_hints(None) == [mine, theirs]
    assert session.help_hints(None) == [mine, theirs, grows]  # ? lists them all, the quieted after
    q.set(grows.id, "", grows.subject)  # the config's mute, lifted for this session
    assert session.line_hints(None) == [mine, theirs, grows]


def test_a_subject_muted_alone_is_passed_over_and_the_rule_names_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    def stalled_jobs(history: object) -> Hint | None:  # as the real rules pick: the first job not passed over
        job = next((j for j in ("job a", "job b") if wanted("training-stalled", j)), None)
        return None if job is None else Hint("training-stalled", "warn", f"{job} stalled", subject=job)

    monkeypatch.setattr(hint_rules, "all_rules", lambda: [stalled_jobs])
    clock = Clock()
    session = _session(snaps=[_snap(100.0), _snap(101.0)], clock=clock)
    assert [h.subject for h in session.line_hints(None)] == ["job a"]
    session.quieted.set("training-stalled", "muted", "job a")
    session.hints_quieted()
    assert [h.subject for h in session.line_hints(None)] == ["job b"]  # the next job's stall shows
    assert [h.subject for h in session.help_hints(None)] == ["job b", "job a"]  # the muted one still in ?
    session.quieted.set("training-stalled", "snoozed", "job b")
    session.hints_quieted()
    # ? lists what the rules name without passing over (job a), not each subject behind it
    assert session.line_hints(None) == [] and [h.subject for h in session.help_hints(None)] == ["job a"]
    clock.now += SNOOZE_S + 1  # the snooze is over: the next tick draws job b again
    assert session.apply(_snap(102.0))
    assert [h.subject for h in session.line_hints(None)] == ["job b"]


def test_edits_of_what_is_watched(tmp_path: Path) -> None:
    runner = FakeRunner()
    session = _session(runner=runner)
    shown: list[str] = []
    session.on_say = lambda said: shown.append(said.text)
    session.add_dataset(str(tmp_path / "nope"))
    session.add_dataset(str(tmp_path))
    session.add_dataset(str(tmp_path))
    assert session.settings.datasets == (str(tmp_path),)
    runner.locks = {str(tmp_path / "x"): 1, "/other": 2}
    session.remove_dataset(str(tmp_path))  # a lock under it is released: no row would be left to unlock it
    assert session.settings.datasets == () and runner.asked == [("release", str(tmp_path / "x"))]
    session.add_server("localhost:8000")
    session.add_server("http://localhost:8000/metrics")
    session.remove_server("localhost:9")
    session.remove_server("http://[bad")
    session.remove_server("localhost:8000")
    assert session.settings.servers == ()
    assert shown == [s.text for s in session.said] == [
        f"no such file or directory: {tmp_path / 'nope'}", f"watching {tmp_path}: scanning…",
        f"{tmp_path} is watched already", f"no longer watching {tmp_path}",
        "scraping http://localhost:8000/metrics", "http://localhost:8000/metrics is scraped already",
        "http://localhost:9/metrics is not scraped (scraped: http://localhost:8000/metrics)",
        shown[7], "no longer scraping http://localhost:8000/metrics"]
    assert shown[7].startswith("not removed: ")


def test_refresh_steps() -> None:
    assert next_refresh(1.0, faster=True) == 0.5 and next_refresh(0.25, faster=True) == 0.25
    assert next_refresh(1.0, faster=False) == 2.0 and next_refresh(30.0, faster=False) == 30.0
    session = _session()
    session.set_refresh(faster=False)
    assert session.settings.refresh_s == 2.0


def test_typed_times_outside_the_history_are_refused() -> None:
    session = _session([_snap(1000.0), _snap(1001.0), _snap(1002.0)], clock=Clock(1002.5))
    assert session.time_refusal("1s ago") is None
    assert session.go_typed("1s ago") == Paused(1001.0)
    assert session.go_typed("now") == Live()
    assert "is outside the history kept" in (session.time_refusal("10") or "")
    assert "not a time" in (session.time_refusal("yesterday-ish") or "")


def test_jump_and_typed_times_move_through_the_history(session: list[Snapshot]) -> None:
    ts = [s.ts for s in session]
    now = ts[-1] + 5
    live = Session(ListFeed(session, start=len(session) - 1), Settings(jump_s=10.0), clock=lambda: now)
    live.open()
    times, jump = live.times(), live.settings.jump_s
    head = live.head.jump(times, -jump)  # from live: pauses, 10 s back, on the sample on screen then
    assert head is not None and head.at == ts[max(i for i, t in enumerate(ts) if t <= ts[-1] - 10)]
    for _ in range(5):
        head = head.jump(times, -jump) or head  # past the oldest: stays on it
    assert head.at == ts[0] and head.jump(times, -jump) is None
    assert live.end_text(-1) == "the oldest sample kept"
    head = head.jump(times, jump)
    assert head is not None and head.at == ts[max(i for i, t in enumerate(ts) if t <= ts[0] + 10)]
    # A clock time (the session was recorded in UTC, as the tests run), then "N s ago". A whole second names the
    # sample shown as that second: the first taken within it (else the one before).
    second = int(ts[10] + 0.999)
    within = [t for t in ts if second <= t < second + 1]
    assert live.go_typed(time.strftime("%H:%M:%S", time.gmtime(second))).at == (
        within[0] if within else ts[max(i for i, t in enumerate(ts) if t <= second)])
    assert live.go_typed(f"{int(now - ts[5])}s ago").at == ts[max(i for i, t in enumerate(ts) if t <= now - int(now - ts[5]))]
    assert "outside the history" in (live.time_refusal("1h ago") or "")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any], float | None]] = []

    def write(self, snapshot: Snapshot) -> None:
        pass

    def event(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None:
        self.events.append((kind, data, ts))


def test_a_marker_needs_a_live_recording_and_v_an_event() -> None:
    assert "start dltop with --record DIR" in (_session().mark_refusal() or "")
    recorder = Recorder()
    session = _session(recorder=recorder)
    assert session.mark_refusal() is None
    session.mark("warm started", 5.0)
    assert recorder.events[-1] == ("marker", {"text": "warm started", "by": "dltop"}, 5.0)
    assert session.said[-1].text.startswith("marker at ") and session.said[-1].text.endswith(": warm started")
    assert session.allows("mark") and not session.allows("events")  # live: v once an action was seen
    assert session.add_events([LiveEvent(1.0, "action", {"action": "warm"})])  # the first: v in the footer
    assert session.allows("events") and not session.add_events([LiveEvent(2.0, "action", {})])


def test_a_replay_of_a_real_recording_steps_changes_speed_and_plays_to_its_end(tmp_path: Path,
                                                                              session: list[Snapshot]) -> None:
    # What the replay keys do to time (tests/test_replay.py presses them once each: the wiring), on `session`
    # recorded for real and read back.
    from tests.test_replay import _recording

    rec = _recording(tmp_path, session)
    ts = rec.times()
    assert ts == [s.ts for s in session]
    replay = Session(None, recorded=Recorded(rec, "session"))
    replay.open()
    times = replay.times()
    assert replay.head.at == ts[0] and replay.head.mode == "replay"
    head = replay.head.step(times, 1).step(times, 1).step(times, -1)  # t t T
    assert head.at == ts[1]
    head = head.faster(1)  # >
    assert head.speed == 10
    head = head.faster(1).faster(1)
    assert head.speed == 60
    head = head.faster(-1)  # <
    assert head.speed == 10
    replay.head = head = head.play(times)  # space
    assert head.playing and replay.allows("pause") and not replay.allows("play")
    shown = set()
    while head.playing:  # the screen's play timer: a tick every 0.25 s, x10 through a 40 s recording
        head = head.tick(times, 0.25)
        shown.add(head.at)
        assert head.playing is (head.at != ts[-1])  # playing stops on the last sample, not later
    assert head.at == ts[-1] and len(shown) > 2  # through the samples to its end, and stops there
    replay.head = head
    assert replay.allows("play") and replay.end_text(1) == "the last sample of the recording"
    assert not replay.allows("faster") and not replay.allows("slower")  # + and -: a recording keeps its cadence
    assert replay.settings.refresh_s == 1.0
    replay.head = head.step(times, -3)  # T T T
    view = replay.view()
    assert replay.head.at == ts[-4] and view is not None and view.snapshot.ts == ts[-4] and view.replay


def test_a_typed_clock_time_in_a_replay_shows_that_second(tmp_path: Path) -> None:
    # b in a replay (tests/test_replay.py types into the dialog: the wiring): samples fall between whole
    # seconds, and "…:03" shows the sample of …:03.4.
    from dltop.recorder import Recorder, Recording

    base = float(int(time.time()) - 3600)
    snaps = [Snapshot(ts=base + k + 0.4, host="h") for k in range(6)]
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    replay = Session(None, recorded=Recorded(Recording(str(tmp_path / "rec")), "rec"))
    replay.open()
    typed = time.strftime("%H:%M:%S", time.localtime(base + 3))
    assert replay.time_refusal(typed) is None
    assert replay.go_typed(typed).at == snaps[3].ts
