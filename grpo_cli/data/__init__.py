"""Prompts: from files, datasets and generators to rendered, tokenized batches; early data checks."""
