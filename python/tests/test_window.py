"""Windows and the persistent all-gather on the host backend with real processes (2 to 4
ranks): window_ranks.py holds the scenarios. torch is required (the torch scenarios fail, they are
not skipped, without it)."""

import pytest

from conftest import run_ranks


def run(world, scenario, **kw):
    outs = run_ranks(world, scenario, script="window_ranks.py", **kw)
    assert all(f"{scenario} ok" in o for o in outs), outs
    return outs


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_ring_of_puts_and_signals(world):
    run(world, "ring")


def test_the_ring_with_async_calls():
    run(3, "ring_async")


@pytest.mark.parametrize("world", [2, 4])
def test_a_pipeline_with_no_receive(world):
    run(world, "pipeline")


@pytest.mark.parametrize("world", [2, 3])
def test_puts_at_random_offsets(world):
    run(world, "random_offsets")


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_write_disjoint_ranges_at_once(world):
    run(world, "disjoint")


@pytest.mark.parametrize("world", [2, 3])
def test_map_remote_tensor_after_the_signal(world):
    run(world, "map_remote")


@pytest.mark.parametrize("world", [2, 3])
def test_refusals_write_nothing(world):
    run(world, "refusals")


@pytest.mark.parametrize("world", [2, 4])
def test_persistent_all_gather(world):
    # 1,000 executions: 64 s at 4 ranks on two loaded cores; the deadline only a hang reaches.
    run(world, "all_gather_p", timeout=900)


def test_kv_cache_handoff():
    run(3, "kv_handoff")


def test_a_wait_times_out_or_is_aborted():
    run(2, "wait_timeout")


def test_a_wait_for_a_rank_that_exited_fails_at_once():
    outs = run_ranks(3, "peer_exits", script="window_ranks.py")
    assert len(outs) == 3
