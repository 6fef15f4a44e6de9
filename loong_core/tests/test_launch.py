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


def test_max_restarts_across_machines_is_refused_with_the_reason():
    import pytest

    from loong_core.errors import ConfigError
    from loong_core.launch import check_restarts

    check_restarts(LaunchOptions(nproc_per_node=2, max_restarts=3))  # one machine: loong restarts
    with pytest.raises(ConfigError, match="--max-restarts works on one machine only: torch's elastic restart"):
        check_restarts(LaunchOptions(nnodes="2", rdzv_endpoint="head:29400", max_restarts=1))


def test_process_group_rendezvous_times_out_naming_the_address(monkeypatch):
    import time

    import pytest

    from loong_core.errors import TrainingError
    from loong_core.runtime import _rendezvous
    from loong_core.testing import free_port

    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("LOONG_INIT_TIMEOUT", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for rank in (1, 0):  # rank 1: nobody serves the address; rank 0: rank 1 never arrives
        started = time.monotonic()
        with pytest.raises(TrainingError, match=rf"rank {rank} of 2: no process group after 1 s at the "
                                                rf"rendezvous 127.0.0.1:{port}"):
            _rendezvous(rank, 2)
        assert time.monotonic() - started < 30


def test_unreachable_rendezvous_is_one_error_naming_the_endpoint(monkeypatch):
    import pytest
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from loong_core.errors import TrainingError
    from loong_core.launch import _run_torchrun

    seen = []

    def refuse(args):
        seen.extend(args)
        raise RendezvousConnectionError("The connection to the C10d store has failed.")

    monkeypatch.setattr(torchrun, "main", refuse)
    monkeypatch.setenv("LOONG_INIT_TIMEOUT", "120")
    options = LaunchOptions(nnodes="2", node_rank=1, rdzv_endpoint="head:29400")
    with pytest.raises(TrainingError, match="could not join the rendezvous at head:29400 "
                                            r"\(RendezvousConnectionError: The connection"):
        _run_torchrun(options, [])
    assert "--rdzv-conf=join_timeout=120" in seen


def test_a_collective_that_lost_its_peer_is_one_line_naming_the_peer_and_this_node(monkeypatch):
    from loong_core.lost_peer import lost_peer_message

    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [10.0.0.7]:34950: Connection reset by peer")
    message = lost_peer_message(gloo)
    assert message.startswith("lost contact with the rank at 10.0.0.7:34950 in a collective")
    assert "node 1 (" in message and "rank 3 stops too" in message
    assert lost_peer_message(RuntimeError("shape mismatch")) is None
    assert lost_peer_message(ValueError("Connection reset by peer")) is None


def test_elastic_last_call_wait_comes_from_the_environment(monkeypatch):
    options = LaunchOptions(nnodes="1:2", rdzv_endpoint="head:29400")
    monkeypatch.setenv("LOONG_INIT_TIMEOUT", "60")
    monkeypatch.delenv("LOONG_RDZV_LAST_CALL", raising=False)
    assert "--rdzv-conf=join_timeout=60" in torchrun_args(options, [])
    monkeypatch.setenv("LOONG_RDZV_LAST_CALL", "2")
    assert "--rdzv-conf=join_timeout=60,last_call_timeout=2" in torchrun_args(options, [])
