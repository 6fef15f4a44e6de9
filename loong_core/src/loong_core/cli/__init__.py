"""The ``loong`` command line. Subcommands are registered through the plugin hooks."""
