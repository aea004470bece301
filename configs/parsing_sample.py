"""English constituency parsing (section 6.3) on NLTK's public Penn Treebank sample, trained on
a 2-core CPU within a 40-minute budget (the time it takes: docs/PARSING.md, "The final
table"): the task of configs/parsing.py at a CPU's size.

Data: 3,914 WSJ trees (sections 00-01) split by file: train wsj_0001-0159 (3,396 trees),
validation wsj_0160-0179 (273), test wsj_0180-0199 (245); read from
`$AIAYN_DATA_DIR/ptb_sample/treebank.zip` or downloaded from nltk_data.

  python train.py --config=configs/parsing_sample.py --workdir=runs/parse
  python evaluate.py --workdir=runs/parse          # EVALB F1 on the 273 validation trees
  python evaluate.py --workdir=runs/parse --split=test   # the 245 test trees: Table 4's row
  echo "The cat sat on the mat ." | python translate.py --workdir=runs/parse

The paper's 4 layers become 2 here: on the sample, fewer layers learn as fast per step or
faster and take more steps in the 40 minutes (4 layers: 6,000 steps; 3: 7,500; 2: 9,500;
docs/PARSING.md). Decoding is constrained to trees over the input's words
(aiayn_flax/parsing/constrained.py); beam, alpha and the checkpoints averaged are those the
final table chose on the validation files for this row (docs/PARSING.md, "The final table";
tests/test_parsing_config_defaults.py), so evaluate.py's defaults give its constrained row;
at most input + 150 output pieces, which no tree of the sample needs (the
longest excess of tree tokens over sentence pieces is under 100).
"""
from configs import base


def get_config():
  c = base.get_config()
  c.name = "parsing_sample"
  c.needs_accelerator = False  # made for a laptop CPU
  c.dataset.update(
      name="penn_treebank",
      train_split="train",
      eval_split="validation",
      test_split="test",
      vocab_model_type="unigram",
      vocab_sample_sentences=0,
      vocab_character_coverage=1.0,
      max_length=256,
      # Ten batch shapes (16, 24, 32, 48, ..., 256): each is one compile of the train step.
      bucket_min_length=16,
      bucket_growth=1.3,
      bucket_quantum=8,
      # A tree is about twice its sentence's pieces: each side padded to its own length
      # (data/bucketing.py), 38% of the source positions padding instead of 57%.
      pad_each_side=True,
  )
  c.dataset.treebank_dir = ""  # NLTK's sample
  # Words, not XX, in the linearized trees: on 3,396 trees a model writing XX plateaued at F1
  # 5 (it never learned which input word it had reached); copying the words teaches that
  # alignment directly (docs/PARSING.md).
  c.dataset.tree_leaves = "words"
  # 80K words of training text: a 4000-piece vocabulary splits rare words into pieces that
  # recur (suffixes, numbers) instead of giving each its own rarely trained embedding.
  # The CPU quick start's width (configs/multi30k.py), 2 layers (see the docstring).
  c.model.update(vocab_size=4000, d_model=128, d_ff=512, num_heads=4, num_layers=2,
                 dropout_rate=0.1)
  c.warmup_steps = 600  # peak learning rate 0.5 * 128^-0.5 * 600^-0.5 = 1.8e-3 (at 3.6e-3 the XX
  # run sat on a plateau from step 300)
  c.learning_rate_scale = 0.5
  c.tokens_per_batch = 2000  # real target tokens per step, about 32 trees
  # Chosen to fit the 40-minute budget on 2026-11-26's host; what it takes since each side is
  # padded to its own length: docs/PARSING.md, "The final table".
  c.num_train_steps = 9500
  c.steps_per_call = 4  # as the CPU quick start (configs/multi30k.py)
  c.log_every_steps = 50
  c.eval_every_steps = 2000
  c.checkpoint_every_minutes = 0  # by steps: the checkpoints averaged are the same on any host
  c.checkpoint_every_steps = 100
  c.keep_checkpoints = 20
  # The last 2,000 steps: the final table's choice on validation for this row (over 3 seeds,
  # constrained beam 10, alpha 2.0; docs/PARSING.md, "The final table").
  c.average_last_checkpoints = 20
  c.eval_decode_sentences = 273  # the whole validation split, greedy-parsed for its F1
  c.decode_batch_size = 64
  # The final table's choice on the validation files (beam 10; alpha 0.6 / 1.0 / 1.5 / 2.0; last
  # 5 / 20), mean over 3 seeds: docs/PARSING.md, "The final table". evaluate.py's defaults.
  c.beam_size = 10
  c.length_penalty_alpha = 2.0
  c.decode_extra_length = 150
  return c
