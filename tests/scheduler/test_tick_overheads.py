"""The verify gate's tick overheads: a synchronous tick's figure no spike can hold up, and one that is
measured again when the gate keeps declining on it."""

from __future__ import annotations

from mlxd_scheduler.prompt_lookup_arm import SYNC_SAMPLES_NEEDED, SYNC_STALE_TICKS, TickOverheads
from mlxd_scheduler.recent_timings import RecentTimings


def test_recent_timings_lower_median_and_least():
    timings = RecentTimings(keep=3)
    assert timings.lower_median() is None and timings.least() is None
    for ms in (5.0, 1.0, 3.0, 2.0):  # the first falls out of the window
        timings.add(ms)
    assert len(timings) == 3 and timings.lower_median() == 2.0 and timings.least() == 1.0


def test_a_first_slow_synchronous_tick_does_not_set_the_figure():
    overheads = TickOverheads()
    assert overheads.sync_ms == 0.0  # nothing measured: nothing priced
    overheads.observe("sync", wall_ms=12.0, forward_ms=2.0)  # a one-off: 10 ms beyond its forward
    overheads.observe("sync", wall_ms=2.6, forward_ms=2.0)
    assert abs(overheads.sync_ms - 0.6) < 1e-9  # the least while few were seen
    for _ in range(SYNC_SAMPLES_NEEDED):
        overheads.observe("sync", wall_ms=2.8, forward_ms=2.0)
    overheads.observe("sync", wall_ms=30.0, forward_ms=2.0)  # a later spike
    assert abs(overheads.sync_ms - 0.8) < 1e-9  # the lower median of the recent ticks


def test_a_figure_no_synchronous_tick_refreshes_is_forgotten_after_declines():
    overheads = TickOverheads()
    overheads.observe("sync", wall_ms=12.0, forward_ms=2.0)  # only a spike seen, then the gate declines
    for _ in range(SYNC_STALE_TICKS - 1):
        overheads.observe("plain", wall_ms=5.0, forward_ms=4.8)
        overheads.declined()
    assert overheads.sync_ms == 10.0
    overheads.declined()
    assert overheads.sync_ms == 0.0  # forgotten: the next verify measures it again
    overheads.observe("sync", wall_ms=2.5, forward_ms=2.0)
    for _ in range(SYNC_STALE_TICKS - 1):
        overheads.declined()
    assert abs(overheads.sync_ms - 0.5) < 1e-9  # a synchronous tick restarts the count
