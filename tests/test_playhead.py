"""Time as one value (dltop/playhead.py), as plain Python: the moves through a timeline's times and which keys
act in each mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop.playhead import KEYS, SPEEDS, Live, Paused, Replay
from dltop.timeline import index_at

TIMES = [100.0, 101.0, 102.0, 103.0, 110.0, 111.0]  # a gap of 7 s after 103


def test_live_steps_back_into_the_past_and_forward_to_live_again() -> None:
    head = Live()
    assert head.step(TIMES, 1) is None  # live has nothing newer
    back = Live().step(TIMES, -3)
    assert back == Paused(102.0) and back.past
    assert back.step(TIMES, 2) == Paused(110.0)
    assert back.step(TIMES, 3) == Live()  # the newest sample is live again
    assert Paused(100.0).step(TIMES, -1) is None  # the oldest kept


def test_jump_moves_by_time_and_at_least_one_sample_over_a_gap() -> None:
    assert Paused(100.0).jump(TIMES, 2.5) == Paused(102.0)
    assert Paused(103.0).jump(TIMES, 2.0) == Paused(110.0)  # nothing 2 s later: the next sample
    assert Paused(110.0).jump(TIMES, -2.0) == Paused(103.0)
    assert Live().jump(TIMES, -10.0) == Paused(101.0)
    assert Live().jump(TIMES, 5.0) is None
    assert Paused(100.0).jump(TIMES, -5.0) is None


def test_go_shows_the_sample_on_screen_then() -> None:
    assert Live().go(TIMES, 105.0) == Paused(103.0)
    assert Live().go(TIMES, 50.0) == Paused(100.0)  # before the first: the first
    assert Paused(100.0).go(TIMES, 200.0) == Live()
    assert Replay(100.0).go(TIMES, 200.0) == Replay(111.0, pos=111.0)  # a replay is always at a moment


def test_pause_and_live() -> None:
    assert Live().pause(TIMES) == Paused(111.0)
    assert Live().pause([]) == Live()  # nothing shown yet
    assert Paused(101.0).live() == Live()
    playing = Replay(101.0, playing=True, pos=101.5)
    assert playing.pause(TIMES) == Replay(101.0, playing=False, pos=101.5)
    assert playing.live() is playing


def test_a_paused_moment_that_leaves_the_history_becomes_the_oldest_kept() -> None:
    assert Paused(100.0).kept_within(101.0) == Paused(101.0)
    assert Paused(102.0).kept_within(101.0) == Paused(102.0)
    assert Live().kept_within(101.0) == Live()


def test_playing_moves_at_the_speed_chosen_and_stops_at_the_end() -> None:
    head = Replay(100.0, pos=100.0).faster(1)
    assert head.speed == 10 and head.faster(1).speed == 60 and head.faster(1).faster(1).speed == SPEEDS[-1]
    assert head.faster(-1).faster(-1).speed == 1
    head = head.play(TIMES)
    assert head.playing and head.mode == "playing"
    head = head.tick(TIMES, 0.25)  # 2.5 s of the recording
    assert (head.at, head.pos, head.playing) == (102.0, 102.5, True)
    head = head.tick(TIMES, 0.25)
    assert (head.at, head.pos) == (103.0, 105.0)  # in the gap: the sample on screen then
    head = head.tick(TIMES, 1.0)
    assert (head.at, head.playing) == (111.0, False)  # at its end playing stops
    again = head.play(TIMES)  # from the start again
    assert (again.at, again.pos, again.playing) == (100.0, 100.0, True)


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=30, unique=True), st.floats(-1e4, 2e4),
       st.integers(-40, 40))
def test_every_move_lands_on_a_sample(raw: list[float], ts: float, n: int) -> None:
    times = sorted(raw)
    for head in (Live(), Paused(times[0]), Replay(times[0], pos=times[0])):
        for moved in (head.go(times, ts), head.step(times, n), head.jump(times, float(n))):
            if moved is None:
                continue
            assert moved.at is None or moved.at in times
            assert isinstance(moved, Replay) == isinstance(head, Replay)
            assert moved.at is not None or moved == Live()
            if moved.at is not None and not isinstance(moved, Replay):
                assert moved.at < times[-1]  # the newest is live, not a pause on it
        stepped = head.step(times, n)
        i = len(times) - 1 if head.at is None else index_at(times, head.at)
        if stepped is None:
            assert n == 0 or min(max(i + n, 0), len(times) - 1) == i


@pytest.mark.parametrize(("head", "mode"), [(Live(), "live"), (Paused(1.0), "paused"), (Replay(1.0), "replay"),
                                            (Replay(1.0, playing=True), "playing")])
def test_which_time_keys_act_is_one_table_keyed_on_the_mode(head, mode: str) -> None:
    assert head.mode == mode
    # space: exactly one of pause, live and play acts in each mode, so the footer names what it does now
    assert [a for a in ("pause", "live", "play") if head.allows(a)] == [
        {"live": "pause", "paused": "live", "replay": "play", "playing": "pause"}[mode]]
    assert head.allows("step", (1,)) is head.past  # live has nothing newer
    assert head.allows("step", (-1,)) and head.allows("jump", (-1,)) and head.allows("go_to", (False,))
    assert head.allows("go_to", (True,)) is head.past  # labelled in the footer only where the past is on screen
    assert head.allows("speed", (1,)) is head.replay
    assert head.allows("faster") is (not head.replay)  # a recording keeps its cadence
    assert head.allows("mark") is None and head.allows("quit") is None  # not time keys: the App decides
    assert KEYS[mode] <= {k for m in KEYS.values() for k in m}
