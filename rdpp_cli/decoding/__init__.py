"""rdpp decoding: greedy, beam, random, top-k, nucleus and diverse beam search."""

from rdpp_cli.decoding.decode import METHODS, DecodeConfig, Decoded, decode

__all__ = ["METHODS", "DecodeConfig", "Decoded", "decode"]
