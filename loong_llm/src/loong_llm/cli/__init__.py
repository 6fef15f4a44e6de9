"""``loong`` subcommands added by the llm plugin (each module imports torch only when run)."""
