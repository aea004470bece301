"""English constituency parsing as a sequence-to-sequence task (section 6.3, Table 4).

treebank.py reads and preprocesses Penn Treebank trees, linearize.py turns a tree into the
target sequence and any decoded sequence back into a tree, evalb.py scores trees as EVALB does.

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax
"""
