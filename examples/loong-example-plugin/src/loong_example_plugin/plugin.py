"""Registers a balancer and a config folder, and records lifecycle events to a file."""

from __future__ import annotations

import json

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_balancers(register):
    register("round_robin", "loong_example_plugin.balancer:round_robin",
             description="sample i goes to rank i mod R")


@hookimpl
def loong_config_search_path():
    return "pkg://loong_example_plugin.conf"


@hookimpl
def loong_on_log_step(run, step, metrics):
    if run.rank == 0:
        with open(run.run_dir / "example_events.jsonl", "a") as f:
            f.write(json.dumps({"event": "log_step", "step": step, "loss": metrics["loss"]}) + "\n")


@hookimpl
def loong_on_train_end(run, metrics):
    if run.rank == 0:
        with open(run.run_dir / "example_events.jsonl", "a") as f:
            f.write(json.dumps({"event": "train_end", "step": run.iteration}) + "\n")
