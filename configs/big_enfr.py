"""Transformer big on WMT14 EN->FR (section 6.1: 41.8 BLEU on newstest2014 after 3.5 days on
8 P100): configs/big.py with the English-French data, a 32000-piece shared vocabulary (5.1)
and dropout 0.1 instead of 0.3 (6.1).

The paper's training set has 36M sentence pairs; tfds' wmt14_translate/fr-en train split
(Europarl v7, Common Crawl, UN, News Commentary v9, Giga-FrEn) has about 40.8M. Its
"validation" split is newstest2013 and "test" newstest2014 (3003 lines):
`python evaluate.py --workdir=... --testset=split:test`. The paper's "word-piece" vocabulary
is stood in for by SentencePiece BPE, as for EN->DE.
"""
from configs import big


def get_config():
  c = big.get_config()
  c.name = "big_enfr"
  c.dataset.update(name="wmt14_translate/fr-en", source_lang="en", target_lang="fr")
  c.model.update(vocab_size=32000, dropout_rate=0.1)
  return c
