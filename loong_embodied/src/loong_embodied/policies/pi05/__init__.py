"""Pi0.5-style vision-language-action policy: a VLM prefix and an action expert sharing attention."""
