"""rdpp training."""
