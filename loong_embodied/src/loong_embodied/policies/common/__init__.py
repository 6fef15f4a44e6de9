"""Pieces the vision-language-action policies share: prompt tokens, flow matching, vision, conditioning."""
