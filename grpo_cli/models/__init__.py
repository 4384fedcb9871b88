"""Loading models and tokenizers (hub, local folders, GGUF, builtin tiny models), LoRA, export."""
