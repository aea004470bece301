"""Autoregressive decoding: greedy search, and beam search with the GNMT length penalty.

Both searches know nothing about the model. They drive it through one callback:

  tokens_to_logits(ids: int32[N, 1], cache) -> (logits: float[N, V], new_cache)

`ids` holds, for each of the N rows, the token emitted at the previous step (BOS at the first
step); `cache` is whatever the model needs to go on (self-attention keys/values, encoder output
and padding mask, a position counter...). The cache contract:

  * every array leaf with ndim >= 1 has the rows (N) on its leading axis: beam search repeats
    those rows for the beams (`expand_to_beams`) and reorders them when hypotheses change
    parents (`gather_beams`);
  * scalar leaves (ndim 0, e.g. the current decoding position) are shared by all rows and are
    passed through untouched.

A model may instead keep its per-hypothesis state in place and give beam search its own
`reorder_cache` (see `beam_search`): model.py's decoder does, so that reordering moves a small
table instead of every layer's keys and values.

A model whose step reads its whole cache may also start with a short one and have the search
grow it (`CacheStages`): the search then runs one loop per stage, and between stages calls
`grow(cache, length)`.

The searches run a fixed number of rows every step (static shapes under `jax.jit`), so rows
that have nothing left to say are still fed a token: PAD for finished rows in greedy search, an
arbitrary token for empty beams. Their logits are ignored. With `Compaction`, a search goes on
with the sentences not yet done alone once few are left: rows are decoded independently, so
the results are the same, and the batch's longest sentences no longer carry the rest.

Conventions shared by both searches:

  * outputs hold generated tokens only (no BOS): each hypothesis ends with EOS, then PAD (0);
  * sentence b emits at most `min(max_lengths[b], max_decode_len)` tokens, EOS included: at its
    last allowed step every token but EOS is masked out (EOS keeps the model's log-prob, as in
    fairseq), so every hypothesis returned is complete;
  * EOS is masked out before `min_words` tokens (default 1, fairseq's `--min-len`), unless the
    sentence's max length leaves no room: an output is never empty where it may hold a word.
    Without it, beam search gave an empty translation for some long sentences, whose full
    hypotheses all scored below EOS alone (2 of Multi30k's 1014 validation sentences on the
    quick start's run, with beam 4 and averaging);
  * log-probabilities are computed in float32 whatever the dtype of the logits;
  * a task may rewrite each step's log-probs before the search reads them
    (`constrain_log_probs`, e.g. a parser's trees over the input's words): a token it sets to
    -inf cannot come next. EOS at a sentence's last allowed step keeps the model's log-prob
    whatever it says.

The package, by concern:

  contract.py       the step callback's type, the cache's rows (expand_to_beams,
                    gather_beams), PAD and -inf
  searches.py       greedy_decode, beam_search, length_penalty
  chunked_top_k.py  top-k and argmax over the vocabulary chunk by chunk (fast on CPU)
  compaction.py     the loop in cache stages (CacheStages), and on the sentences left
                    (Compaction, take_sentences)

Its public names are re-exported here: `decoding.beam_search(...)`.

May import: aiayn_flax.runtime, aiayn_flax.data
"""
from aiayn_flax.decoding.chunked_top_k import argmax_by_chunks, best_extensions, top_k_by_chunks
from aiayn_flax.decoding.compaction import CacheStages, Compaction, take_sentences
from aiayn_flax.decoding.contract import (NEG_INF, PAD_ID, Cache, ConstrainLogProbs,
                                         TokensToLogits, expand_to_beams, gather_beams)
from aiayn_flax.decoding.searches import beam_search, greedy_decode, length_penalty

__all__ = ["NEG_INF", "PAD_ID", "Cache", "CacheStages", "Compaction", "ConstrainLogProbs",
           "TokensToLogits", "argmax_by_chunks", "beam_search", "best_extensions",
           "expand_to_beams", "gather_beams", "greedy_decode", "length_penalty",
           "take_sentences", "top_k_by_chunks"]
