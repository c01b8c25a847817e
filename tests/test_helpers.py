"""The suite's own helpers where a mistake in them would hide one elsewhere or outlive the suite."""

from __future__ import annotations

from helpers import process_alive, rank_result, run_ranks, wait_for


def _rank_with_persistent_workers(rank: int, world: int, port: int, payload: dict, out: str) -> None:
    """A DataLoader whose two workers persist, and a process of its own that would sleep ten
    minutes (unlike the loader's workers, it has no watchdog that ends it with its parent); then
    the result: the start method, the pids of those three processes."""
    import multiprocessing
    import time

    from torch.utils.data import DataLoader

    loader = DataLoader(range(8), batch_size=2, num_workers=2, persistent_workers=True)
    assert sorted(int(i) for batch in loader for i in batch) == list(range(8))
    multiprocessing.Process(target=time.sleep, args=(600,)).start()
    workers = [p.pid for p in multiprocessing.active_children()]
    rank_result(out, rank, {"start_method": multiprocessing.get_start_method(), "workers": workers})


def test_ranks_fork_their_loader_workers_and_leave_no_process_behind(tmp_path):
    """A rank's DataLoader workers fork from it, as under torchrun on Linux, and end with it, as does
    any other process it started. Ranks forked from the forkserver once took forkserver as their
    start method: every rank started a server whose workers imported torch again, and the server and
    its persistent workers outlived the suite."""
    ranks = run_ranks(_rank_with_persistent_workers, {}, tmp_path)
    workers = [pid for r in ranks for pid in r["workers"]]
    assert [r["start_method"] for r in ranks] == ["fork", "fork"] and len(workers) == 6
    wait_for(lambda: not any(map(process_alive, workers)), "the processes the ranks started ending with them", 60)
