"""rdpp models."""
