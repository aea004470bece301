"""Imported at start-up by every process of a test cluster (multi_host_launch.cluster_env puts
this folder first on PYTHONPATH): the processes after process 0 load the programs that process
0 compiles, from the shared compilation cache, instead of compiling each again.

1. The cache key. JAX keys a cache entry with the topology's fingerprint, and only process 0
   writes entries. On a TPU or GPU cluster every process computes the same fingerprint; on a
   CPU cluster each computes its own (XLA's CPU topology describes the calling process's
   devices), so the other processes would never find an entry. For CPU devices the key hashes
   each device's kind, id and process instead, which every process sees alike.
2. Waiting for process 0. The processes reach each program together, so without more the others
   miss the entry that process 0 is still compiling and compile the program themselves: on
   this 2-core test machine, every cluster's compiling CPU doubled. Before it compiles a
   program that spans the processes, process 0 says so in the coordinator's key-value store,
   and says again once the entry is written; another process that misses the cache looks for
   the first word for up to START_WAIT_S, waits for the second, then reads the entry. Process 0
   names its cache folder when it joins: a process whose folder is another (its keys differ
   too: the compile options name the folder) compiles for itself at once. Whenever something
   else differs (process 0 runs without this module, took another path, found the entry
   already, could not write it, or stopped), the process compiles the program itself as
   before, at most START_WAIT_S later: never a hang.
   (JAX's own jax_share_binary_between_hosts waits for process 0 without such a bound: a
   cluster whose process 0 stopped early hung.)
3. Test-only switches, from this process's environment (a test sets them per process), set in
   the modules they switch once those are imported:
   - AIAYN_TEST_SECONDS_PER_CLOCK_READING: "30" makes the trainer's clock (trainer.clock)
     advance 30 s at each reading, "0" stand still, so that the hosts each read a clock of
     their own (tests/test_checkpoint_by_time.py);
   - AIAYN_TEST_REPLICA_PARALLEL: "0" saves checkpoints as on a GPU (orbax's copy to the host
     in slices off), "1" as orbax does on a CPU or TPU (checkpoints.REPLICA_PARALLEL;
     tests/test_storage_failures.py).
"""
import functools
import itertools
import os
import time

from aiayn_flax.runtime import import_hooks  # imports nothing of JAX

START_WAIT_S = 3  # process 0 reaches the program later than this process, or never
ANNOUNCED_WAIT_S = 1  # process 0 says it shares as soon as it has joined
COMPILE_WAIT_S = 600


def _same_on_every_process(cache_key) -> None:
  own_fingerprint = getattr(cache_key, "_hash_accelerator_config", None)
  if own_fingerprint is None or not hasattr(cache_key, "_hash_string"):
    return  # another JAX: the processes compile for themselves, only slower

  def hash_accelerator_config(hash_obj, accelerators):
    devices = list(accelerators.flat)
    if not devices or any(device.platform != "cpu" for device in devices):
      return own_fingerprint(hash_obj, accelerators)
    for device in devices:
      cache_key._hash_string(
          hash_obj, f"{device.device_kind}:{device.id}:{device.process_index}")

  cache_key._hash_accelerator_config = hash_accelerator_config


def _say(client, key: str, value: str = "1") -> None:
  try:
    client.key_value_set(key, value, allow_overwrite=True)
  except Exception:  # noqa: BLE001 - no coordinator: the others compile for themselves
    pass


def _heard(client, key: str, seconds: float) -> str | None:
  """The value of `key` in the coordinator's store once it is there, asked every 20 ms; None
  after `seconds`, or at any answer but "not there yet" (no coordinator any more)."""
  deadline = time.monotonic() + seconds
  while True:
    try:
      return client.key_value_try_get(key)
    except Exception as e:  # noqa: BLE001 - JaxRuntimeError: not there yet, or no coordinator
      if "NOT_FOUND" not in str(e) or time.monotonic() > deadline:
        return None
    time.sleep(0.02)


_SHARES = "aiayn_test/process_zero_shares"


def _cache_folder() -> str:
  import jax  # imported by then: JAX is running
  return f"cache folder: {jax.config.jax_compilation_cache_dir}"


@functools.cache
def _process_zero_folder(client) -> str | None:
  """Process 0's cache folder, as it said when it joined; None when it runs without this
  module (a test may start it with another PYTHONPATH): asked once."""
  return _heard(client, _SHARES, ANNOUNCED_WAIT_S)


def _announce(distributed) -> None:
  initialize = distributed.State.initialize

  def initialize_and_announce(self, *args, **kwargs):
    initialize(self, *args, **kwargs)
    if self.process_id == 0 and self.client is not None:
      _say(self.client, _SHARES, _cache_folder())
  distributed.State.initialize = initialize_and_announce


def _others_wait_for_process_zero(compiler) -> None:
  compile_and_write = getattr(compiler, "_compile_and_write_cache", None)
  read = getattr(compiler, "_cache_read", None)
  distributed = getattr(compiler, "distributed", None)
  if not (compile_and_write and read and distributed):
    return  # another JAX: every process compiles, only slower

  def compile_and_write_cache(backend, computation, executable_devices, compile_options,
                              host_callbacks, module_name, cache_key):
    state = distributed.global_state
    if state.client is None or executable_devices.is_fully_addressable:
      return compile_and_write(backend, computation, executable_devices, compile_options,
                               host_callbacks, module_name, cache_key)
    compiling, written = f"aiayn_test/compiling/{cache_key}", f"aiayn_test/written/{cache_key}"
    if state.process_id == 0:
      _say(state.client, compiling)
      try:
        return compile_and_write(backend, computation, executable_devices, compile_options,
                                 host_callbacks, module_name, cache_key)
      finally:
        _say(state.client, written)  # written, or not: the others read the cache either way
    theirs = _process_zero_folder(state.client)
    if theirs is not None and theirs != _cache_folder():
      compiler.logger.debug("%s: process 0 writes to another %s; compiling it here",
                            module_name, theirs)
    elif (theirs is not None and _heard(state.client, compiling, START_WAIT_S) is not None
          and _heard(state.client, written, COMPILE_WAIT_S) is not None):
      executable, _ = read(module_name, cache_key, compile_options, backend, executable_devices)
      if executable is not None:
        compiler.logger.debug("%s: read the entry process 0 compiled", module_name)
        return executable
    return compile_and_write(backend, computation, executable_devices, compile_options,
                             host_callbacks, module_name, cache_key)

  compiler._compile_and_write_cache = compile_and_write_cache


# Once the modules are imported, whoever imports them: importing JAX here, before the command
# sets its environment, could change how JAX starts.
import_hooks.call_after_import("jax._src.cache_key", _same_on_every_process)
import_hooks.call_after_import("jax._src.compiler", _others_wait_for_process_zero)
import_hooks.call_after_import("jax._src.distributed", _announce)

SECONDS_PER_CLOCK_READING = "AIAYN_TEST_SECONDS_PER_CLOCK_READING"
REPLICA_PARALLEL = "AIAYN_TEST_REPLICA_PARALLEL"


def _clock_of_its_own(trainer) -> None:
  seconds, readings = float(os.environ[SECONDS_PER_CLOCK_READING]), itertools.count()
  trainer.clock = lambda: seconds * next(readings)


def _replica_parallel(checkpoints) -> None:
  checkpoints.REPLICA_PARALLEL = os.environ[REPLICA_PARALLEL] == "1"


if SECONDS_PER_CLOCK_READING in os.environ:
  import_hooks.call_after_import("aiayn_flax.training.trainer", _clock_of_its_own)
if REPLICA_PARALLEL in os.environ:
  import_hooks.call_after_import("aiayn_flax.runtime.checkpoints", _replica_parallel)
