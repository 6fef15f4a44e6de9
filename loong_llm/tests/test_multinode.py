"""Two nodes on loopback (one rank each, a static rendezvous) with node-local caches
(``data.shared_cache=false``): each node prepares its own copy of the data, the index files rank 0
builds reach the other node, and the run trains.

The nodes run in separate working directories with the same relative ``LOONG_CACHE``, so both see
the same cache path on different disks, as two machines would.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from loong_core.testing import free_port, losses, run_train


@pytest.mark.multirank
def test_two_nodes_with_node_local_caches_each_prepare_and_train(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    overrides = ["experiment=llama_debug", "data.shared_cache=false", "trainer.train_iters=2",
                 "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false",
                 "trainer.log_interval=1", f"trainer.run_dir={run_dir}"]
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir()

    def node(rank: int):
        return run_train(overrides, env={"LOONG_CACHE": "cache"}, timeout=300, check=False,
                         cwd=tmp_path / f"node{rank}",
                         launch_args=["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint,
                                      "--rdzv-id", "multinode-test"])

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(node, (0, 1)))
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]
    caches = [tmp_path / f"node{rank}" / "cache" for rank in (0, 1)]
    prepared = [sorted(str(p.relative_to(c)) for p in c.rglob("*") if p.is_file()) for c in caches]
    assert any(name.endswith("train.bin") for name in prepared[0])
    assert any(name.endswith("shuffle_index.npy") for name in prepared[0])
    assert prepared[0] == prepared[1]
    assert sorted(losses(run_dir)) == [1, 2]
