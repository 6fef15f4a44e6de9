"""``loong train`` passes multi-node and elastic options through to torchrun."""

from __future__ import annotations

from loong_core.launch import LaunchOptions, torchrun_args


def test_single_node_uses_loopback_and_a_port():
    args = torchrun_args(LaunchOptions(nproc_per_node=4, master_port=29511), ["model=x"])
    assert "--nproc-per-node=4" in args and "--master-port=29511" in args
    assert args[-3:] == ["-m", "loong_core.worker", "model=x"]


def test_multi_node_elastic_options_pass_through():
    options = LaunchOptions(nproc_per_node=8, nnodes="2:4", node_rank=1, rdzv_endpoint="head:29400",
                            rdzv_id="job7", max_restarts=3)
    args = torchrun_args(options, [])
    for expected in ("--nnodes=2:4", "--rdzv-endpoint=head:29400", "--rdzv-id=job7",
                     "--max-restarts=3", "--rdzv-backend=c10d", "--node-rank=1"):
        assert expected in args


def test_one_rank_runs_in_process():
    assert LaunchOptions().single_process
    assert not LaunchOptions(nproc_per_node=2).single_process
    assert not LaunchOptions(nnodes="2").single_process
