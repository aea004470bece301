"""A trained run leaves the project: its averaged parameters written for CTranslate2 and for
Hugging Face transformers' Marian classes, and those engines driven as a user would drive them.

  weights.py         what can be exported (refusals naming the config field), and the
                     parameters in one plain layout: per layer, per projection, x @ W + b
  vocabulary.py      the run's vocabulary as a SentencePiece model (the toy's symbols too)
  to_ctranslate2.py  a CTranslate2 model folder, through its own Converter and TransformerSpec
  to_marian.py       a MarianMTModel folder with its tokenizer's files
  engines.py         greedy and beam translation through both, with our length limit

The exporters' own packages (ctranslate2; transformers and torch) are imported inside the
functions that need them: the `export` extra installs them, and nothing else reads them.

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax
"""
