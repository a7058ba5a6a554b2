"""rdpp: diverse and accurate image captioning with reinforced DPPs (Wang & Chan, 2019)."""

__version__ = "0.2.0"
