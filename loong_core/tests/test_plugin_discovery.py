"""Plugins are found through real ``loong`` entry points, and failures are reported, not fatal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loong_core.errors import PluginError
from loong_core.plugins import get_plugin_system
from loong_core.testing import install_plugin

BROKEN = "import this_module_does_not_exist\n"
DUPLICATE = '''
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_register_models(register):
    register("toy_gpt", "loong_dupe.model:Other")
'''
MISSPELLED = '''
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_register_modles(register):
    register("x", "a:b")
'''


def loong(*args, env=None):
    """Run the CLI in a subprocess; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "loong_core.cli.main", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def plugins_json(env=None):
    code, out, err = loong("plugins", "--json", env=env)
    assert code == 0, err
    return {p["name"]: p for p in json.loads(out)}


def test_entry_point_plugin_is_listed_with_hooks_and_names(toy_site):
    records = plugins_json()
    toy = records["toy"]
    assert toy["distribution"] == "loong-toy"
    assert toy["version"] == "0.0.1"
    assert toy["error"] is None
    assert toy["hooks"] == ["loong_config_search_path", "loong_register_datasets", "loong_register_models"]
    assert toy["registered"] == {"model": ["toy_gpt"], "dataset": ["toy_tokens"]}
    assert records["core"]["registered"]["device"] == ["cpu", "cuda"]


def test_plugins_table_names_every_plugin(toy_site):
    code, out, _ = loong("plugins")
    assert code == 0
    assert "toy" in out and "loong-toy" in out and "toy_gpt" in out


def test_broken_plugin_is_reported_not_fatal(toy_site):
    install_plugin(toy_site, "loong-broken", "broken", {"loong_broken": BROKEN})
    records = plugins_json()
    assert "ModuleNotFoundError" in records["broken"]["error"]
    assert records["toy"]["error"] is None


def test_command_needing_a_missing_name_names_the_broken_plugin(toy_site):
    install_plugin(toy_site, "loong-broken", "broken", {"loong_broken": BROKEN})
    code, _, err = loong("config", "show", "experiment=toy", "model.name=llama9")
    assert code == 2
    assert "Unknown model 'llama9'" in err
    assert "plugin 'broken' (loong-broken) failed to load" in err
    assert "LOONG_DISABLE_PLUGINS=broken" in err


def test_disable_and_allow_lists(toy_site):
    assert "toy" not in plugins_json({"LOONG_DISABLE_PLUGINS": "toy"})
    assert "toy" not in plugins_json({"LOONG_DISABLE_PLUGINS": "loong-toy"})
    allowed = plugins_json({"LOONG_PLUGINS": "toy"})
    assert set(allowed) == {"core", "toy"}


def test_duplicate_name_from_two_distributions_is_an_error_naming_both(toy_site):
    install_plugin(toy_site, "loong-dupe", "dupe", {"loong_dupe": DUPLICATE})
    system = get_plugin_system(reload=True)
    with pytest.raises(PluginError) as excinfo:
        system.registry().get("model", "toy_gpt")
    message = str(excinfo.value)
    assert "loong-toy" in message and "loong-dupe" in message
    records = plugins_json()
    assert "loong-toy" in records["dupe"]["error"] and "loong-dupe" in records["dupe"]["error"]


def test_misspelled_hook_implementation_is_reported(toy_site):
    install_plugin(toy_site, "loong-typo", "typo", {"loong_typo": MISSPELLED})
    records = plugins_json()
    assert "loong_register_modles" in records["typo"]["error"]


GROUPED = '''
from loong_core.hookspecs import hookimpl

def add_{action}(subparsers):
    p = subparsers.add_parser("{action}", help="{action} data")
    p.set_defaults(func=lambda args, extra: print("ran {action}") or 0)

@hookimpl
def loong_register_cli_commands(register):
    register("data {action}", "loong_{action}:add_{action}")
'''


def test_two_plugins_add_actions_under_one_command(toy_site, monkeypatch):
    install_plugin(toy_site, "loong-alpha", "alpha", {"loong_alpha": GROUPED.format(action="alpha")})
    install_plugin(toy_site, "loong-beta", "beta", {"loong_beta": GROUPED.format(action="beta")})
    env = {"LOONG_PLUGINS": "alpha,beta"}
    assert loong("data", "alpha", env=env)[1].strip() == "ran alpha"
    assert loong("data", "beta", env=env)[1].strip() == "ran beta"
    code, out, _ = loong("data", "--help", env=env)
    assert code == 0 and "alpha" in out and "beta" in out


PLAIN_DATA = '''
from loong_core.hookspecs import hookimpl

def add_data(subparsers):
    subparsers.add_parser("data").set_defaults(func=lambda args, extra: 0)

@hookimpl
def loong_register_cli_commands(register):
    register("data", "loong_plain:add_data")
'''


def test_plain_command_clashing_with_a_shared_command_is_skipped_with_a_warning(toy_site):
    install_plugin(toy_site, "loong-alpha", "alpha", {"loong_alpha": GROUPED.format(action="alpha")})
    install_plugin(toy_site, "loong-plain", "plain", {"loong_plain": PLAIN_DATA})
    env = {"LOONG_PLUGINS": "alpha,plain"}
    code, out, err = loong("data", "alpha", env=env)
    assert code == 0 and out.strip() == "ran alpha"
    assert "clashes with" in err and "loong-plain" in err and "loong-alpha" in err
