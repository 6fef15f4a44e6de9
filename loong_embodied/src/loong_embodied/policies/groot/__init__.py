"""GR00T-N1.6-style vision-language-action policy: VLM features from a middle layer + a DiT action head."""
