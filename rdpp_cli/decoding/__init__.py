"""rdpp decoding: greedy, beam, random, top-k, nucleus and diverse beam search.

``config.py`` (the settings, no torch), ``decode.py`` (``decode``, ``Decoded``: the decoder),
``select.py`` (``--select``), ``options.py`` and ``sample.py`` (the `rdpp sample` stage). This
package's own namespace holds only the torch-free settings, so that the CLI can build `rdpp sample`
without loading torch: import the decoder from ``rdpp_cli.decoding.decode``.
"""

from rdpp_cli.decoding.config import METHODS, DecodeConfig, DecodingOptions

__all__ = ["METHODS", "DecodeConfig", "DecodingOptions"]
