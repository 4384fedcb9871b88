"""The math of GRPO and its variants: pure tensor functions and their registries."""
