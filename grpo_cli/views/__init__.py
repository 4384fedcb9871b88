"""What a person sees of a run: inspect-rollouts, report."""
