"""Run by test_decoding.py in a process with 8 simulated CPU devices: the Translator decoding
data-parallel over the 8 (each batch's rows split, padded with empty rows to a multiple of 8)
gives exactly the translations and n-best scores of a Translator on one device, greedy and
beam 4, with batches that 8 does not divide; a decoding batch size counted per device
(config.decode_batch_size) fills the 8 devices with the translations of one; and sentences
left to go on alone stay on their devices."""
import os
import sys

# LLVM at -O0 (--xla_backend_optimization_level=0): the time here is compiling small programs
# that run once, and what is compared is one layout against another, both compiled alike
# (43.7 -> 29.0 s for this script alone, 2 cores).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_cpu_collective_call_terminate_timeout_seconds=120"
                           " --xla_backend_optimization_level=0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from aiayn_flax import sharding, train_step  # noqa: E402
from aiayn_flax.data import toy  # noqa: E402
from aiayn_flax.translator import Translator  # noqa: E402
from configs import toy as toy_config  # noqa: E402


def main():
  assert jax.device_count() == 8, jax.devices()
  config = toy_config.get_config()
  # One layer of each stack: how decoding is split over devices does not depend on depth, and
  # its decoding programs compile faster (81 -> 70 s for this script, alone).
  config.model.num_layers = 1
  model = train_step.make_model(config)
  # Random parameters, with the embeddings of PAD, UNK and BOS zeroed (the output projection
  # is the shared embedding): the translations are symbols, up to EOS or the length limit.
  params = train_step.init_params(model, 0)
  embedding = params["shared_embedding"]["embedding"]
  params["shared_embedding"]["embedding"] = embedding.at[np.array([0, 2, 3])].set(0.0)
  vocab = toy.SymbolVocabulary(config.model.vocab_size)
  rng = np.random.default_rng(0)
  # 13 sentences of 1 to 20 symbols and 2 empty ones: batches of 5, 5 and 3 (batch_size 5),
  # padded to 8 rows on 8 devices; a 20-symbol source pads to 32 tokens.
  sentences = [" ".join(map(str, rng.integers(4, 20, rng.integers(1, 21)))) for _ in range(13)]
  sentences[4:4] = ["", "  "]
  eight = sharding.data_parallel_mesh()
  one = sharding.data_parallel_mesh(jax.devices()[:1])
  assert eight.shape == {"data": 8} and one.shape == {"data": 1}
  # On CPU the mesh keeps the devices' order (what the multi-device tests compare relies on
  # it): mesh_utils reorders TPU chips along their torus, never CPU devices.
  assert list(eight.devices.flat) == jax.devices()
  assert list(sharding.make_mesh("data:4,model:2").devices.flat) == jax.devices()
  for beam_size in (1, 4):
    kwargs = dict(beam_size=beam_size, extra_length=10, batch_size=5, num_results=beam_size)
    on_one = Translator(model, params, vocab, mesh=one, **kwargs).translate_nbest(sentences)
    translator = Translator(model, params, vocab, mesh=eight, **kwargs)
    assert all(leaf.sharding.is_fully_replicated and len(leaf.devices()) == 8
               for leaf in jax.tree.leaves(translator.params))  # whole on each, placed once
    calls, decode = [], translator._decode

    def recording_decode(params, inputs):
      calls.append((inputs.shape, inputs.sharding.spec, {s.data.shape for s in
                                                         inputs.addressable_shards}))
      return decode(params, inputs)
    translator._decode = recording_decode
    on_eight = translator.translate_nbest(sentences)
    # Batches of 5, 5 and 3 sentences (5, 5 and 4 rows on one device), each padded to 8 rows:
    # one per device.
    assert [(shape[0], spec, shards) for shape, spec, shards in calls] == [
        (8, P("data"), {(1, shape[1])}) for shape, _, _ in calls] and len(calls) == 3, calls
    # The same translations; scores within float rounding (XLA's CPU kernels for 1 row per
    # device and for 5 rows sum in other orders: 1e-6 apart).
    assert [[text for text, _ in nbest] for nbest in on_eight] == [
        [text for text, _ in nbest] for nbest in on_one], (beam_size, on_one, on_eight)
    np.testing.assert_allclose([score for nbest in on_eight for _, score in nbest],
                               [score for nbest in on_one for _, score in nbest], rtol=1e-5)
    assert on_eight[4] == on_eight[5] == [] and all(on_eight[i] for i in range(4))
    words = sum(len(text.split()) for nbest in on_eight for text, _ in nbest)
    print(f"beam {beam_size}: {len(sentences)} sentences, the same {beam_size}-best lists "
          f"({words} symbols)")
  check_batch_size_per_device(model, params, vocab, sentences, one, eight)
  check_compaction_stays_on_each_device(model, eight)
  print("OK")


def check_compaction_stays_on_each_device(model, eight):
  """Over 8 devices, the sentences a batch goes on with once few are left are gathered on
  each device from its own rows (decoding.Compaction's groups): the compacted program needs
  little more memory than decoding every batch whole, where a gather across devices copied
  the whole cache onto each (3.3x for greedy, 3.4x for beam 4 here; big's beam search on 8
  V100s no longer fitted), and greedy search runs no all-gather."""
  from jax.sharding import NamedSharding
  import jax.numpy as jnp

  from aiayn_flax import translator as translator_lib
  replicated = NamedSharding(eight, P())
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                        jax.eval_shape(lambda: train_step.init_params(model, 0)))
  sources = jax.ShapeDtypeStruct((64, 32), jnp.int32, sharding=NamedSharding(eight, P("data")))
  for beam_size in (1, 4):
    compiled = {compact: translator_lib.make_decode_fn(
        model, beam_size, 0.6, 10, devices=8, compact=compact).lower(params, sources).compile()
        for compact in (False, True)}
    temp = {compact: c.memory_analysis().temp_size_in_bytes for compact, c in compiled.items()}
    assert temp[True] <= 1.5 * temp[False], (beam_size, temp)
    if beam_size == 1:
      assert "all-gather(" not in compiled[True].as_text()
    print(f"beam {beam_size}: compacted program {temp[True] / temp[False]:.2f}x the memory of "
          "whole batches")


def check_batch_size_per_device(model, params, vocab, sentences, one, eight):
  """config.decode_batch_size (and evaluate.py's and translate.py's --batch_size) counts per
  device: 2 is a batch of 2 sentences on one device and of 16 on eight (the trainer, evaluate.py
  and translate.py size their Translator with sharding.over_decoding_devices), so eight devices
  decode the 13 sentences in one batch of 16 rows, 2 on each device, where a global 2 would
  leave 6 of every 8 rows padding; the translations are those of one device, whose batches
  hold 2 sentences."""
  assert sharding.over_decoding_devices(2) == sharding.over_decoding_devices(2, eight) == 16
  assert sharding.over_decoding_devices(2, one) == 2
  for beam_size in (1, 4):
    kwargs = dict(beam_size=beam_size, extra_length=10, num_results=beam_size)
    on_one = Translator(model, params, vocab, mesh=one,
                        batch_size=sharding.over_decoding_devices(2, one), **kwargs)
    assert len(on_one.batch_shapes(sentences)) > 1  # several batches of 2 on one device
    on_one = on_one.translate_nbest(sentences)
    translator = Translator(model, params, vocab,  # every device, as the trainer's
                            batch_size=sharding.over_decoding_devices(2), **kwargs)
    calls, decode = [], translator._decode

    def recording_decode(params, inputs):
      calls.append((inputs.shape, {s.data.shape for s in inputs.addressable_shards}))
      return decode(params, inputs)
    translator._decode = recording_decode
    on_eight = translator.translate_nbest(sentences)
    assert calls == [((16, 32), {(2, 32)})], calls  # one batch: 13 sentences + 3 empty rows
    assert [[text for text, _ in nbest] for nbest in on_eight] == [
        [text for text, _ in nbest] for nbest in on_one], (beam_size, on_one, on_eight)
    np.testing.assert_allclose([score for nbest in on_eight for _, score in nbest],
                               [score for nbest in on_one for _, score in nbest], rtol=1e-5)
    print(f"beam {beam_size}, 2 sentences per device: one batch of 16 rows on 8 devices, the "
          "translations of batches of 2 on one")


if __name__ == "__main__":
  main()
