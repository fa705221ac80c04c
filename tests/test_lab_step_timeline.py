"""lab.gpu_step_timeline's step boundaries (the profile itself is GPU-only)."""

from lab.gpu_step_timeline import one_step


def _kernels(starts):
    return [{"name": f"k{i}", "ts": float(t), "dur": 1.0, "stream": 7, "grid": None} for i, t in enumerate(starts)]


def test_one_step_is_the_last_replays_launches_even_when_a_gap_inside_a_step_is_the_longest():
    # three replays of a 4-kernel step; inside each step a 50-us gap, between steps (host sync) 20 us
    step = [0, 2, 52, 54]
    ks = _kernels([t + 80 * r for r in range(3) for t in step])
    last = one_step(ks, 3)
    assert [k["ts"] for k in last] == [160.0, 162.0, 212.0, 214.0]


def test_a_launch_count_that_does_not_divide_falls_back_to_the_largest_gaps():
    ks = _kernels([0, 1, 2, 100, 101, 200, 201, 202])
    assert [k["ts"] for k in one_step(ks, 3)] == [200.0, 201.0, 202.0]
