"""English constituency parsing, Vaswani et al. (2017) section 6.3, Table 4 "WSJ only":
a 4-layer Transformer with d_model 1024 trained on the Wall Street Journal part of the Penn
Treebank (sections 02-21, about 40K sentences), 16K vocabulary, decoded with beam 21, alpha
0.3 and at most input length + 300 output tokens, scored by EVALB (COLLINS.prm) on section 23.
The paper reports 91.3 F1.

Data: point `dataset.treebank_dir` at the LDC treebank's (LDC99T42) `parsed/mrg/wsj` folder:

  python train.py --config=configs/parsing.py --workdir=runs/wsj \\
      --config.dataset.treebank_dir=/data/treebank_3/parsed/mrg/wsj

(left empty, it trains on NLTK's public sample, which configs/parsing_sample.py is sized for).
Sentences are the model's input, linearized trees its output (aiayn_flax/parsing/, docs/PARSING.md).

"Everything else as the base model" (Table 3 row "base"): heads, d_ff, dropout 0.1, label
smoothing 0.1, Adam and its schedule with warmup 4000, ~25k tokens per step, the last 5
checkpoints averaged. The paper tuned dropout, learning rate and beam size on section 22 without
giving the values; these are base's, and the step count is ours (the paper gives none): 20k
steps are about 140 epochs of WSJ's ~3.5M target tokens at 25k per step.
"""
from configs import base


def get_config():
  c = base.get_config()
  c.name = "parsing"
  c.dataset.update(
      name="penn_treebank",
      train_split="train",  # WSJ 02-21 (the sample: wsj_0001-0159)
      eval_split="validation",  # 22 (wsj_0160-0179)
      test_split="test",  # 23 (wsj_0180-0199)
      vocab_model_type="unigram",
      vocab_sample_sentences=0,  # all: words and trees of ~40K sentences
      vocab_character_coverage=1.0,
      # Training pairs longer than this (in pieces, either side) are skipped; a linearized
      # tree is about 2.5 tokens a word, and WSJ 02-21 sentences stay under ~150 words.
      max_length=512,
      pad_each_side=True,  # sentences are about half their trees' length (data/bucketing.py)
  )
  c.dataset.treebank_dir = ""  # the LDC's parsed/mrg/wsj folder; "": NLTK's public sample
  c.dataset.tree_leaves = "XX"  # Vinyals et al.'s linearization, which the paper followed
  c.model.update(vocab_size=16000, d_model=1024, num_layers=4)
  c.num_train_steps = 20_000
  c.eval_every_steps = 2000
  c.eval_decode_sentences = 1700  # dev sentences (all of section 22) greedy-parsed for its F1
  c.beam_size = 21
  c.length_penalty_alpha = 0.3
  c.decode_extra_length = 300
  c.decode_batch_size = 16  # sentences x 21 beams per decoding batch
  return c
