"""Exact, vectorized CIDEr-D (coco-caption's ``Cider``), for scoring and for the training reward.

    from rdpp_cli.metrics.cider import CiderD, DocFreq

    CiderD().score(hyps, refs)                 # corpus mode, like pycocoevalcap.cider.Cider
    CiderD(DocFreq.from_h5(path)).score_and_pairwise(samples, refs)   # the R-DPP reward's two terms

The package, one idea per file, in reading order (each opens with why it exists and what it
guarantees; docs/metrics.md walks through the whole):

* ``scorer.py``    -- :class:`CiderD`: which captions are compared with which, and where idf comes from
* ``kernel.py``    -- the CIDEr-D formula on postings (pair scores within a row of captions)
* ``postings.py``  -- the n-gram join: captions compared together share a row; one sort finds the
  n-grams they share (also used by Div-n and mBLEU through :func:`ngram_postings`)
* ``docfreq.py``   -- :class:`DocFreq`: fixed document frequencies (``cider_df.h5``)
* ``hashtable.py`` -- the exact hash table :class:`DocFreq` looks n-grams up in
* ``keys.py``      -- an n-gram as one exact int64 (or pair of them), for any vocabulary size
* ``captions.py``  -- strings, id lists, arrays or tensors -> token ids

Results equal pycocoevalcap to ~1e-15 (only the order of floating-point additions differs).
"""

from rdpp_cli.metrics.cider.docfreq import DocFreq
from rdpp_cli.metrics.cider.keys import N_ORDER
from rdpp_cli.metrics.cider.postings import Postings, ngram_postings
from rdpp_cli.metrics.cider.scorer import SIGMA, CiderD

__all__ = ["N_ORDER", "SIGMA", "CiderD", "DocFreq", "Postings", "ngram_postings"]
