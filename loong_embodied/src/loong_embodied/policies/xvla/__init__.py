"""X-VLA-style vision-language-action policy: per-domain soft prompts and a transformer that predicts the actions."""
