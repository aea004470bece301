"""The runtime of a run on one host or many, the layer below everything else; no model code.

  cluster.py            joining the hosts of a multi-host launch (jax.distributed)
  process_zero.py       what process 0 alone reads (text, files), handed to every process
  host_agreement.py     checks that every host agrees (config, vocabulary, batch plan), and
                        stopping every host together when one fails
  stops.py              SIGTERM/SIGINT and checkpoint-by-time stops agreed between hosts
  workdir_lease.py      the lease that lets one run at a time use a workdir
  checkpoints.py        orbax checkpoints: saving, restoring, their bytes and room
  paths.py              workdir paths: a local folder or gs://
  storage_errors.py     a failed write (full disk, read-only, refused) in one line
  compilation_cache.py  JAX's persistent compilation cache
  huge_pages.py         the one log line on host malloc's huge pages
  garbage_collection.py Python's garbage collector, run less often by the entry points
  provenance.py         the software versions a run records
  tensorflow_setup.py   TensorFlow (tfds' input pipeline) kept off the accelerators
  import_hooks.py       code run right after a module is imported, whoever imports it

Knows nothing of models, data or tasks: everything above may import it.

May import: none
"""
