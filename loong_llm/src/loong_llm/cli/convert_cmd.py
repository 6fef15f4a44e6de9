"""``loong convert hf-to-loong | loong-to-hf``: checkpoints between Hugging Face and loong.

Nothing heavy is imported here; the work is in :mod:`loong_llm.hf.convert`.
"""

from __future__ import annotations


def add_parser(subparsers) -> None:
    """Add the ``convert`` subcommand and its two directions."""
    p = subparsers.add_parser("convert", help="convert checkpoints between Hugging Face and loong")
    sub = p.add_subparsers(dest="convert_command", metavar="DIRECTION", required=True)
    to_loong = sub.add_parser(
        "hf-to-loong", help="HF directory (config.json + safetensors) -> loong checkpoint",
        description="Write an iteration-0 loong checkpoint sharded for the given layout, streaming "
        "one tensor at a time. By default it holds the weights only: start a run from it with "
        "trainer.init_from=DST. With --with-optimizer it also holds a fresh optimizer and LR "
        "schedule so that trainer.resume=DST works (about 3x the memory); give the run's optim.* / "
        "trainer.* settings as trailing KEY=VALUE overrides (e.g. optim.lr=3e-4 trainer.train_iters=1000).")
    to_loong.add_argument("--family", default=None,
                          help="model family (llama, qwen2, qwen3, ...; default: the one that "
                               "reads config.json's model_type)")
    to_loong.add_argument("src", metavar="SRC_HF_DIR")
    to_loong.add_argument("dst", metavar="DST")
    to_loong.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    to_loong.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    to_loong.add_argument("--ep", type=int, default=1, help="expert-parallel size (default 1)")
    to_loong.add_argument("--with-optimizer", action="store_true",
                          help="also store a fresh optimizer and LR schedule (for trainer.resume=DST; "
                               "needs about 3x the memory of weights only)")
    to_loong.add_argument("--model-only", action="store_true",
                          help="weights only (the default; kept for scripts)")
    to_loong.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                          help="optim.* / trainer.* settings of the stored LR schedule")
    to_loong.set_defaults(func=run_hf_to_loong, accepts_overrides=True, exit_without_teardown=True)
    to_hf = sub.add_parser(
        "loong-to-hf", help="loong checkpoint -> HF directory loadable by AutoModelForCausalLM")
    to_hf.add_argument("src", metavar="SRC")
    to_hf.add_argument("dst", metavar="DST_HF_DIR")
    to_hf.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                       help="storage dtype (default: the source HF model's, else bfloat16)")
    to_hf.set_defaults(func=run_loong_to_hf, exit_without_teardown=True)


def _check_family(family: str) -> None:
    from loong_core.errors import ConfigError
    from loong_core.plugins.registry import did_you_mean
    from loong_llm.hf.registry import family_names

    names = family_names()
    if family not in names:
        raise ConfigError(f"Unknown family '{family}'.{did_you_mean(family, names)} "
                          f"Families: {', '.join(names)}.")


def _schedule(overrides: list[str]) -> dict:
    """``["optim.lr=1e-3", ...]`` -> ``{"optim": {"lr": 0.001}}`` (values parsed as YAML)."""
    import yaml

    from loong_core.errors import ConfigError

    out: dict = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"bad override {item!r}: expected optim.KEY=VALUE or trainer.KEY=VALUE.")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


def run_hf_to_loong(args, extra) -> int:
    """Run ``loong convert hf-to-loong``."""
    if args.family is None:
        from pathlib import Path

        from loong_llm.hf.adapter import read_hf_config
        from loong_llm.hf.registry import family_for_model_type

        args.family = family_for_model_type(read_hf_config(args.src).get("model_type"),
                                            str(Path(args.src) / "config.json"))
    _check_family(args.family)
    from loong_llm.hf.convert import hf_to_loong

    result = hf_to_loong(args.family, args.src, args.dst, args.tp, args.pp, args.ep,
                         _schedule([*args.overrides, *extra]), not args.with_optimizer)
    mb = result["bytes"] / 1e6
    print(f"converted {args.src} -> {args.dst}: {mb:.1f} MB in {result['seconds']:.1f}s "
          f"({mb / max(result['seconds'], 1e-9):.1f} MB/s)")
    from loong_core.plugins import get_plugin_system
    from loong_llm.hf.next_command import train_command

    config_class = get_plugin_system().registry().get("model", args.family).load_meta("config")
    print(f"train from it: loong train {' '.join(train_command(args.dst, config_class))}")
    return 0


def run_loong_to_hf(args, extra) -> int:
    """Run ``loong convert loong-to-hf``."""
    from loong_llm.hf.convert import loong_to_hf

    result = loong_to_hf(args.src, args.dst, args.dtype)
    mb = result["bytes"] / 1e6
    print(f"wrote {args.dst}: {mb:.1f} MB in {result['seconds']:.1f}s "
          f"({mb / max(result['seconds'], 1e-9):.1f} MB/s)")
    return 0
