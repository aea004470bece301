"""The two tasks of the paper on one Transformer: translation (sections 5-6.2) and English
constituency parsing (section 6.3), with the toy reversal task of the tests beside them.

The model, trainer, checkpoints, decoder, data pipeline and dry run are shared and know no task:
they are handed one and call it. A task owns what differs:

  text_pair_chunks(config, split)     the (source, target) text the pipeline tokenizes
  sources_and_references(config, s)   what is decoded and what the outputs are scored against
  prepare_data(config)                download / prepare its data (process 0 of a multi-host run)
  reserved_pieces(config)             pieces the vocabulary must hold whole
  cache_key_fields(config)            config fields that change the token ids (the cache's key)
  decoding_constraint(vocab)          what the decoder may write (None: anything)
  stand_in_decoding_constraint(size)  the same for the dry run, on a vocabulary of that size
  outputs(sources, decoded)           what a user reads (translate.py)
  validation_sentences(config)        how many validation sentences training decodes
  validation_metrics(...)             the trainer's validation metrics (BLEU; EVALB F1)
  evaluate_split                      None, or evaluate.py's whole evaluation of a split
                                      (parsing: trees, EVALB files, F1)

  tasks/translation.py   Translation (any translation dataset)
  tasks/toy.py           ToyReversal (config.dataset.name "toy_reverse")
  tasks/parsing.py       Parsing ("penn_treebank"; its own code in aiayn_flax/parsing/)

`for_config(config)` picks the task from `config.dataset.name`: this table is the one place
that maps a dataset to its task.

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax,
  aiayn_flax.parsing
"""
from aiayn_flax.tasks.parsing import Parsing
from aiayn_flax.tasks.toy import ToyReversal
from aiayn_flax.tasks.translation import Translation

TASK_OF_DATASET = {"penn_treebank": Parsing.for_config, "toy_reverse": ToyReversal.for_config}


def for_config(config):
  """The task a config trains: by its dataset's name, translation for any other."""
  return TASK_OF_DATASET.get(config.dataset.name, Translation.for_config)(config)
