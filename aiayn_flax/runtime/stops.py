"""Stopping a run on SIGTERM (a preemption notice, a scheduler) or SIGINT (Ctrl-C): checkpoint
the current step, then exit with 128 + the signal's number (train.py).

With several processes every one must stop after the same step, or the collective checkpoint
would wait forever for those still training; and a signal often reaches one host only. So after
every call of the train step, each process contributes the signal it has caught (0 for none) to
a tiny max-reduction over all devices, and all of them read its result one call later: the same
value everywhere, hence the same stop step and the same exit status (SIGTERM wins over SIGINT).
Reading it one call late keeps the host from waiting for the step it has just dispatched; it
works for any steps_per_call, where JAX's preemption sync point names one exact step that a
loop advancing K steps at a time can jump over.

The same agreement stops a run whose workdir lease another run has taken over (process 0
holds the lease: workdir_lease.py): it contributes LEASE_LOST_CODE, above every signal, and
every process stops with LEASE_LOST, saving nothing.

And it decides when a checkpoint by time is due (config.checkpoint_every_minutes): each
process's clock may differ, and all must save after the same step, so a second value rides
along, 1 where a process finds one due; after the reduction `checkpoint_due` says whether any
process did.
"""
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# Test-only: "SIGTERM:30" makes the trainer send itself SIGTERM once its step reaches 30 (SIGINT
# and SIGKILL likewise), so that tests interrupt a run at a known step instead of racing it.
TEST_SIGNAL_VARIABLE = "AIAYN_TEST_SIGNAL_AT_STEP"
# What `poll` returns when the workdir's lease was lost, and the value that says so in the
# reduction (above every signal's number: it wins over a signal caught at the same time).
LEASE_LOST = "lease lost"
LEASE_LOST_CODE = 1000


class StopSignals:
  """SIGTERM/SIGINT ask the loop to checkpoint and stop (`requested`: the signal's name); a
  second signal stops the process at once."""

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self.requested, self._signals = None, signals

  def __enter__(self):
    self._previous = {s: signal.signal(s, self._handle) for s in self._signals}
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler if handler is not None else signal.SIG_DFL)

  def _handle(self, signum, frame):
    if self.requested is not None:
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    self.requested = signal.Signals(signum).name
    logging.warning("%s received: checkpointing at the current step, then stopping "
                    "(send it again to stop at once)", self.requested)


class StopAgreement:
  """`poll(step)` after each call of the train step: the signal every process agreed to stop
  for (LEASE_LOST where the workdir's lease was lost), or None. Alone, the signal this process
  caught; with several processes, the strongest signal any of them had caught one call
  earlier. Every process must call it equally often.

  `wait`: block until each reduction is done (simulated CPU devices can deadlock on
  collectives dispatched ahead, see the trainer's wait_each_step). `lease_lost`: the
  threading.Event of this process's workdir lease (workdir_lease.Lease.lost; None on the
  processes that hold none). `checkpoint_due`: a function saying whether this process finds a
  checkpoint by time due; after each `poll`, the attribute `checkpoint_due` says whether the
  processes agreed that one is (always False without the function)."""

  def __init__(self, signals: StopSignals, wait: bool = False, lease_lost=None,
               checkpoint_due=None):
    self.signals, self._wait, self._pending = signals, wait, None
    self._lease_lost = lease_lost
    self._due, self.checkpoint_due = checkpoint_due, False
    self._test_signal = _test_signal()
    if jax.process_count() > 1:
      by_process = [[d for d in jax.devices() if d.process_index == p]
                    for p in range(jax.process_count())]
      mesh = Mesh(np.array(by_process), ("processes", "local"))
      self._caught = NamedSharding(mesh, P("processes"))
      self._strongest = jax.jit(lambda caught: jnp.max(caught, axis=0),
                                out_shardings=NamedSharding(mesh, P()))

  def poll(self, step: int) -> str | None:
    if self._test_signal and step >= self._test_signal[1]:
      logging.warning("test: sending %s to this process after step %d",
                      self._test_signal[0].name, step)
      signal.raise_signal(self._test_signal[0])  # its handler has run when this returns
      self._test_signal = None
    lost = self._lease_lost is not None and self._lease_lost.is_set()
    if jax.process_count() == 1:
      self.checkpoint_due = bool(self._due and self._due())
      return LEASE_LOST if lost else self.signals.requested
    agreed, agreed_due = ((int(v) for v in np.asarray(self._pending))
                          if self._pending is not None else (0, 0))
    self.checkpoint_due = bool(agreed_due)
    # Not while the agreed checkpoint is yet to be saved (after this poll): it resets the clock.
    due = not self.checkpoint_due and bool(self._due and self._due())
    caught = signal.Signals[self.signals.requested].value if self.signals.requested else 0
    caught = LEASE_LOST_CODE if lost else caught
    self._pending = self._strongest(jax.make_array_from_process_local_data(
        self._caught, np.array([[caught, due]], np.int32), (jax.process_count(), 2)))
    if self._wait:
      jax.block_until_ready(self._pending)
    if agreed == LEASE_LOST_CODE:
      return LEASE_LOST
    return signal.Signals(agreed).name if agreed else None


def _test_signal() -> tuple | None:
  """(signal, step) from AIAYN_TEST_SIGNAL_AT_STEP="SIGTERM:30", or None when it is not set."""
  value = os.environ.get(TEST_SIGNAL_VARIABLE)
  if not value:
    return None
  name, _, step = value.partition(":")
  if name not in ("SIGTERM", "SIGINT", "SIGKILL") or not step.isdigit():
    raise ValueError(f"{TEST_SIGNAL_VARIABLE}={value!r}: expected SIGTERM, SIGINT or SIGKILL, "
                     "a colon and a step")
  return signal.Signals[name], int(step)
