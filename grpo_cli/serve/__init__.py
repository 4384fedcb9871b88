"""`grpo serve-vllm`: a vLLM engine behind a small authenticated HTTP API (see server.py)."""
