"""Generation backends: turn B prompts into B*G completions (a `Rollout`)."""
