"""rdpp metrics."""
