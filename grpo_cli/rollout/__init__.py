"""Rollouts: the generation backends (backends.py: transformers `generate`, a colocated vLLM engine, `grpo
serve-vllm`), what they share (common.py), the asynchronous pipeline (pipeline.py), and the rollout source
the engine asks for each step's batch (source.py)."""
