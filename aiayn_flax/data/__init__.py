"""Data: tfds sources, the shared SentencePiece vocabulary, token-bucketed batches."""
