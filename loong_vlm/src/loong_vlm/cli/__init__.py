"""Command-line actions of the vlm plugin (registered through ``loong_register_cli_commands``)."""
