"""grpo: fine-tune language models with GRPO and its variants (Dr. GRPO, DAPO, GSPO, CISPO, SAPO).

Importing this package must stay cheap: no torch, no transformers (`grpo --help` is instant).
"""

__version__ = "0.1.0"
