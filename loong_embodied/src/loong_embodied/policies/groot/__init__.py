"""GR00T-N1.5-style vision-language-action policy: VLM features from a middle layer + a DiT action head."""
