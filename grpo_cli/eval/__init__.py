"""Evaluation: pass@k / maj@k and evaluating models on held-out problems."""
