"""Rollouts: the generation backends (backends.py: one entry each, with its capabilities and builder: transformers
`generate`, a colocated vLLM engine, `grpo serve-vllm`), what they share (common.py), and the rollouts the engine is
handed for each step's batch (rollouts.py: sampled now or k steps ahead with the pipeline.py schedule; dynamic.py:
DAPO's dynamic sampling as a wrapper; recorded.py: a replay's records)."""
