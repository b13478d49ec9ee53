"""What training optimises and evaluation measures, shared so the two agree: preference losses, per-sequence log-probs,
reward models and functions, sampled rollouts."""
