"""rdpp scoring."""
