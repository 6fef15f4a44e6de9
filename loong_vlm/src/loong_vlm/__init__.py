"""loong VLM plugin: vision encoders, projectors, encoder + foundation composition."""
