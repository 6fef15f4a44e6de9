"""Example external loong plugin."""
