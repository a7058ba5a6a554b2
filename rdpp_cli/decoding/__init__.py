"""rdpp decoding."""
