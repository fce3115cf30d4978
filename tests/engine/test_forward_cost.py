"""The forward cost model: fitted from timed forwards, calibrated at start-up."""

from __future__ import annotations

import pytest

from mlxd_engine import Engine, ForwardCost, calibrate_forward_cost


def test_not_ready_until_two_widths_are_seen():
    cost = ForwardCost()
    assert cost.estimate(1, 1, 10) is None
    cost.observe(1, 1, 10, 50.0)  # the first forward of a shape is not counted
    cost.observe(1, 1, 10, 5.0)
    assert not cost.ready and cost.estimate(1, 9, 10) is None
    cost.observe(1, 9, 10, 130.0)
    cost.observe(1, 9, 10, 13.0)
    assert cost.ready and cost.estimate(1, 9, 10) == pytest.approx(13.0, rel=0.05)
    assert cost.estimate(1, 1, 10) == pytest.approx(5.0, rel=0.05)


def test_fits_fixed_and_per_token_cost():
    cost = ForwardCost()
    for rows in (1, 2, 4, 8):
        for width in (1, 5, 9):
            for context in (50, 500, 50, 500):
                cost.observe(rows, width, context, 3.0 + 0.5 * rows * width + 0.2 * rows * width * context / 1024)
    fixed, per_token, per_kcontext = cost.coefficients()
    assert fixed == pytest.approx(3.0, rel=0.02) and per_token == pytest.approx(0.5, rel=0.02)
    assert per_kcontext == pytest.approx(0.2, rel=0.1)
    assert cost.estimate(3, 3, 100) == pytest.approx(3.0 + 4.5 + 0.2 * 9 * 100 / 1024, rel=0.02)


def test_online_observations_take_over_from_calibration():
    cost = ForwardCost()
    cost.calibrate([(1, 1, 32, 10.0), (1, 9, 32, 90.0)])  # per token, as a 4-bit model on the CPU
    assert cost.estimate(1, 9, 32) == pytest.approx(90.0, rel=0.05)
    for _ in range(200):  # the machine turns out to be fixed-cost bound (a GPU, say)
        cost.observe(1, 1, 32, 10.0)
        cost.observe(1, 9, 32, 11.0)
    assert cost.estimate(1, 9, 32) < 20.0


def test_estimates_never_drop_below_the_fastest_forward_seen():
    cost = ForwardCost()
    for _ in range(2):
        cost.observe(1, 1, 10, 5.0)
        cost.observe(4, 9, 10, 4.0)  # noise: a bigger forward timed faster
    assert cost.estimate(1, 1, 10) >= 4.0


def test_calibration_times_steps_and_verify_forwards_and_leaves_storage_empty(embedded_model):
    engine = Engine(embedded_model, max_sequences=5, prefix_cache_bytes=1 << 20)
    points = calibrate_forward_cost(engine)
    shapes = [(rows, width, "long" if context > 128 else "short") for rows, width, context, _ in points]
    assert shapes == [
        (1, 1, "short"),
        (1, 9, "short"),
        (1, 16, "short"),
        (4, 1, "short"),
        (4, 9, "short"),
        (1, 1, "long"),
        (1, 9, "long"),
        (1, 16, "long"),
    ]
    assert all(ms > 0 for *_, ms in points)
    assert engine.forward_cost.ready and engine.forward_cost.estimate(4, 9, 40) > 0
    assert engine.storage.free_slots == 5 and len(engine.prefix_cache) == 0  # nothing kept


def test_calibration_with_one_free_slot_times_one_row(embedded_model):
    engine = Engine(embedded_model, max_sequences=1, max_kv_size=128)
    points = calibrate_forward_cost(engine)
    assert [(rows, width) for rows, width, _, _ in points] == [(1, 1), (1, 9), (1, 16)]
    assert engine.storage.free_slots == 1


def test_every_timed_forward_counts_in_spent_ms_the_first_of_a_shape_too():
    cost = ForwardCost()
    cost.observe(4, 9, 10, 30.0)  # not fitted (one-off costs), but it was spent
    cost.observe(4, 9, 10, 20.0)
    assert cost.spent_ms == 50.0 and cost.observations == 1


def test_a_ragged_forward_is_not_learned_as_its_padded_shape():
    """A verify forward that computed its rows' real tokens only (ragged.py) costs far less than the padded
    shape its sample names: learning it as that shape would price every padded forward of that shape too low."""
    from mlxd_engine.forward_sample import ForwardSample

    cost = ForwardCost()
    for _ in range(4):
        cost.observe_samples([ForwardSample(8, 9, 100, 130.0), ForwardSample(1, 1, 100, 15.0)])
    before, spent = cost.estimate(8, 9, 100), cost.spent_ms
    cost.observe_samples([ForwardSample(8, 9, 100, 58.0, ragged=True)] * 4)
    assert cost.estimate(8, 9, 100) == before == pytest.approx(130.0)
    assert cost.spent_ms == pytest.approx(spent + 4 * 58.0)  # forward time all the same: not a tick's overhead


def test_a_shape_timed_while_serving_is_estimated_from_its_own_timings():
    """The linear fit cannot follow shapes off its line (a 4 x 3 forward dearer than 8 x 1 and 1 x 9, as
    SmolLM2 times them on 2 cores): once a shape has its own timings, its median is the estimate, moved to
    the asked context by the fit's context term; other shapes still come from the fit."""
    cost = ForwardCost()
    for _ in range(12):
        for rows, width, ms in ((1, 1, 62.0), (1, 9, 121.0), (8, 1, 128.0), (4, 1, 107.0)):
            cost.observe(rows, width, 100, ms)
    fitted = cost.estimate(4, 3, 100)
    assert fitted < 160.0  # the line through the others
    cost.observe(4, 3, 100, 400.0)  # the first of a shape: one-off costs, not counted
    for ms in (175.0, 170.0, 240.0):  # the last: noise the median leaves out
        cost.observe(4, 3, 100, ms)
    assert cost.estimate(4, 3, 100) == pytest.approx(175.0)
    theta = cost.coefficients()
    assert cost.estimate(4, 3, 1124) == pytest.approx(175.0 + theta[2] * 12, rel=1e-6)
    assert cost.estimate(4, 5, 100) == pytest.approx(sum(t * x for t, x in zip(theta, (1.0, 20.0, 20 * 100 / 1024))))
    assert cost.summary()["shapes_timed"] == 5


def test_a_shape_not_timed_for_long_falls_back_to_the_fit():
    from mlxd_engine.forward_cost import STALE_AFTER

    cost = ForwardCost()
    for ms in (1.0, 300.0, 300.0, 300.0):
        cost.observe(4, 3, 10, ms)
    for _ in range(STALE_AFTER + 2):
        cost.observe(1, 1, 10, 10.0)
        cost.observe(1, 9, 10, 30.0)
    assert cost.estimate(4, 3, 10) < 100.0
