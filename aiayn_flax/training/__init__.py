"""Training: the top layer, which puts the others together into a run.

  trainer.py          train_and_evaluate: config -> data -> model -> state -> the loop
  metrics.py          what the loop reports: progress, training metrics, validation
  event_files.py      TensorBoard's event files without TensorFlow, and the log lines
  resume.py           resuming: config fields that may change, the newest readable checkpoint
  checkpoint_room.py  whether checkpoints fit: the dry run's line, checks at start and per save

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax,
  aiayn_flax.parsing, aiayn_flax.tasks, aiayn_flax.planning
"""
