"""rdpp data."""
