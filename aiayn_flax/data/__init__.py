"""Data: tfds sources, the shared SentencePiece vocabulary, token-bucketed batches, and the
public files fetched once into the cache (public_data.py).

Handed a task where one matters; imports none, nor anything above the runtime.

May import: aiayn_flax.runtime
"""
