"""Attention (section 3.2) and dropout (section 5.4): the model layer's pieces below its layers.

  layer.py     MultiHeadAttention, the decoding cache, the masks, the initializers
  backends.py  one attention, its backends and what each serves; the dispatcher
  forms.py     the forms of equation 1: written out, jax's fused (XLA, cuDNN), Pallas's
               kernels, and a decoding step's on the cache
  dropout.py   the hashed-counter dropout of attention weights, residuals and source tokens

model.py builds the layers from these; the names other code reads are here (and re-exported
by model.py: model.Dropout, model.head_dims, ...). A part of the model layer, so it may import
the modules directly in aiayn_flax/ (devices.py chooses a platform's form).

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax
"""
from aiayn_flax.attention.dropout import Dropout, SourceTokenDropout  # noqa: F401
from aiayn_flax.attention.layer import (MultiHeadAttention, _ones, _xavier, _zeros,  # noqa: F401
                                        causal_mask, head_dims, padding_mask)
