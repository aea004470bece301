"""Imported at start-up by every process of a test cluster (multi_host_launch.cluster_env puts
this folder first on PYTHONPATH): the processes after process 0 load the programs that process
0 stored in the shared compilation cache, as the hosts of a TPU or GPU cluster do.

JAX keys a cache entry with the topology's fingerprint, and only process 0 writes entries. On
a TPU or GPU cluster every process computes the same fingerprint; on a CPU cluster each
computes its own (XLA's CPU topology describes the calling process's devices), so the other
processes never find an entry and compile every program again (8-13 s for the toy's train
step here), while process 0 waits for them at the first collective. For CPU devices the key
hashes each device's kind, id and process instead, which every process sees alike.
"""
from aiayn_flax.runtime import import_hooks  # imports nothing of JAX

_MODULE = "jax._src.cache_key"


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


# Once the module is imported, whoever imports it: importing JAX here, before the command sets
# its environment, could change how JAX starts.
import_hooks.call_after_import(_MODULE, _same_on_every_process)
