"""Decoding speed of a trained run: sentences/s and target tokens/s, greedy and beam 4.

  python bench/decode_speed.py --workdir=runs/multi30k [--batch_sizes=64] [--max_sentences=0]
      [--repeats=3] [--devices=8] [--whole_batches]

For each test set (Multi30k test2016, and newstest2014's English source when the data folder
has it) and each batch size, translates the whole set once with greedy search and once with
beam 4 to compile, then times `repeats` pairs of passes, greedy and beam 4 alternately (this
machine's speed drifts by 20-30% over minutes, so the two are compared pass by pass). Prints
one line per (test set, batch size, beam) with the median pass, and the beam-4 / greedy time
ratio: the median of the pairs' ratios.

--devices=N (N simulated CPU devices, or the accelerators there are) compares, in the same
process and pass by pass, decoding data-parallel over all the devices with decoding on one
(the translator over a one-device mesh), for each beam size: the speed-up is the median of the
pairs' time ratios, and both must give the same translations. Simulated CPU devices share the
host's cores, so on CPU this measures what splitting a batch costs or saves, not what 8
accelerators would gain.

Host malloc on huge pages is the environment's setting (start the script with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 on a CPU, as `make quickstart` does;
docs/INSTALL.md#on-a-cpu-malloc-on-huge-pages); the script never restarts itself for it and
says in one log line (aiayn_flax/runtime/huge_pages.py) whether it is on.
"""
import os
import re
import statistics
import sys
import time

# XLA reads the number of simulated CPU devices when jax starts: before any import of jax.
_DEVICES = next((int(arg.split("=", 1)[1]) for arg in sys.argv if arg.startswith("--devices=")), 1)
if _DEVICES > 1:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={_DEVICES}")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from aiayn_flax import run_dir, sharding, tasks  # noqa: E402
from aiayn_flax.translator import Translator  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_list("batch_sizes", ["64"], "Decoding batch sizes to time.")
flags.DEFINE_list("testsets", ["multi30k/test2016", "wmt14"], "Test sets (evaluate.py names).")
flags.DEFINE_integer("max_sentences", 0, "Use only the first N sentences of each set (0: all).")
flags.DEFINE_integer("repeats", 3, "Timed pairs of passes (greedy, beam 4) per batch size.")
flags.DEFINE_bool("profile", False, "Instead of timing: trace one pass of greedy and one of "
                  "beam 4 (jax.profiler) and print where each spends its time, by op category "
                  "(bench/profile_step.py's), with the decoding steps each ran.")
flags.DEFINE_bool("whole_batches", False, "Also time each search decoding every batch whole "
                  "to its end (Translator(compact=False): no sentences going on alone once a "
                  "quarter is left), pass by pass with the default, and check both translate "
                  "the same.")
flags.DEFINE_integer("devices", 1, "Above 1: also time decoding over this many devices against "
                     "one (simulated CPU devices when there are no accelerators).")
FLAGS = flags.FLAGS
BEAM_SIZES = (1, 4)


def timed_translation(translator, sentences) -> tuple[float, list[str]]:
  start = time.perf_counter()
  outputs = translator.translate(sentences)
  return time.perf_counter() - start, outputs


def compare_devices(config, model, params, vocab, sources, batch_size) -> None:
  """Decoding over every device against one device, pass by pass, for each beam size."""
  import jax
  meshes = {"1 device": sharding.data_parallel_mesh(jax.devices()[:1]),
            f"{jax.device_count()} devices": sharding.data_parallel_mesh()}
  for beam_size in BEAM_SIZES:
    translators = {name: Translator(model, params, vocab, beam_size=beam_size,
                                    alpha=config.length_penalty_alpha,
                                    extra_length=config.decode_extra_length,
                                    batch_size=batch_size, mesh=mesh)
                   for name, mesh in meshes.items()}
    outputs = {name: t.translate(sources) for name, t in translators.items()}  # compiles
    if len(set(map(tuple, outputs.values()))) != 1:
      raise RuntimeError(f"beam {beam_size}: the devices translated differently")
    seconds = {name: [] for name in meshes}
    for _ in range(FLAGS.repeats):
      for name, translator in translators.items():
        seconds[name].append(timed_translation(translator, sources)[0])
    one, many = seconds.values()
    ratios = [a / b for a, b in zip(one, many)]
    print(f"batch={batch_size} beam={beam_size}: {len(sources)} sentences, "
          + ", ".join(f"{name} {statistics.median(times):.1f}s" for name, times in seconds.items())
          + f"; speed-up {statistics.median(ratios):.2f} "
          f"(median of {' '.join(f'{r:.2f}' for r in ratios)}), the same translations")


def profile_passes(translators, sources, vocab_size: int) -> None:
  """Where a pass of each search spends its time, by op category, and its decoding steps (the
  calls of the output layer's matmul, one per step and batch)."""
  import jax.numpy as jnp

  from bench import profile_step
  for beam_size, translator in translators.items():
    shapes = translator.batch_shapes(sources)
    lines = {}
    for shape in shapes:  # every compiled program's instruction names
      hlo = translator._decode.lower(translator.params, jnp.zeros(shape, jnp.int32)  # noqa: SLF001
                                     ).compile().as_text()
      lines.update(profile_step.hlo_instructions(hlo))
    start = time.perf_counter()
    seconds, counts = profile_step.thunk_seconds(lambda t=translator: t.translate(sources))
    elapsed = time.perf_counter() - start
    steps = sum(count for name, count in counts.items() if "attend" in lines.get(name, ""))
    per_category = profile_step.by_category(seconds, lines, vocab_size)
    print(f"\nbeam {beam_size}: {len(sources)} sentences, {elapsed:.2f} s traced, {steps} "
          f"decoding steps (summed over batches) in {len(shapes)} batch shape(s), traced thunks "
          f"{sum(per_category.values()):.2f} s\n| category | s per pass | share |\n|---|---:|---:|")
    for name, time_ in per_category.most_common():
      print(f"| {name} | {time_:.3f} | {time_ / sum(per_category.values()):.1%} |")
    print("\n| op | s per pass | calls | source |\n|---|---:|---:|---|")
    for name, time_ in seconds.most_common(15):
      source = re.search(r'op_name="([^"]*)"', lines.get(name, ""))
      print(f"| {name} | {time_:.3f} | {counts[name]} | "
            f"{source.group(1)[-60:] if source else ''} |")


def main(argv):
  del argv
  import jax
  if FLAGS.devices > 1 and jax.device_count() != FLAGS.devices:
    raise SystemExit(f"--devices={FLAGS.devices}: jax has {jax.device_count()} devices")
  config = run_dir.load_config(FLAGS.workdir)
  model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config, 1)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  print(f"workdir: {FLAGS.workdir} (step {steps[-1]})")
  for testset in FLAGS.testsets:
    try:
      sources, _ = run_dir.testset_pairs(testset, config, tasks.for_config(config))
    except Exception as e:  # noqa: BLE001 - e.g. newstest2014 offline without the data folder
      print(f"{testset}: skipped ({e})")
      continue
    sources = sources[:FLAGS.max_sentences or None]
    for batch_size in map(int, FLAGS.batch_sizes):
      if FLAGS.devices > 1:
        print(f"{testset}: decoding over {jax.device_count()} devices against 1")
        compare_devices(config, model, params, vocab, sources, batch_size)
        continue
      ways = [(beam_size, compact) for beam_size in BEAM_SIZES
              for compact in ((True, False) if FLAGS.whole_batches else (True,))]
      translators = {(beam_size, compact): Translator(
          model, params, vocab, beam_size=beam_size, alpha=config.length_penalty_alpha,
          extra_length=config.decode_extra_length, batch_size=batch_size, compact=compact)
          for beam_size, compact in ways}
      outputs = {way: translator.translate(sources)  # compiles every shape
                 for way, translator in translators.items()}
      if any(outputs[beam_size, False] != outputs[beam_size, True]
             for beam_size, compact in ways if not compact):
        raise RuntimeError("decoding batches whole translated differently")
      if FLAGS.profile:
        profile_passes({beam_size: translators[beam_size, True] for beam_size in BEAM_SIZES},
                       sources, config.model.vocab_size)
        continue
      seconds = {way: [] for way in ways}
      for _ in range(FLAGS.repeats):
        for way, translator in translators.items():
          elapsed, again = timed_translation(translator, sources)
          if again != outputs[way]:
            raise RuntimeError(f"beam {way[0]}: a second pass translated differently")
          seconds[way].append(elapsed)
      for beam_size, compact in ways:
        times = seconds[beam_size, compact]
        median = statistics.median(times)
        tokens = sum(len(ids) + 1 for ids in vocab.encode_batch(outputs[beam_size, compact]))
        print(f"{testset} batch={batch_size} beam={beam_size}"
              f"{'' if compact else ' whole batches'}: {len(sources)} sentences in "
              f"{median:.1f}s (median of {' '.join(f'{t:.1f}' for t in times)}) "
              f"= {len(sources) / median:.1f} sentences/s, {tokens / median:.0f} target tokens/s")
        if not compact:
          gains = [whole / now for whole, now in zip(times, seconds[beam_size, True])]
          print(f"{testset} batch={batch_size} beam={beam_size}: whole batches / compacted "
                f"time = {statistics.median(gains):.2f} (median of "
                f"{' '.join(f'{g:.2f}' for g in gains)}), the same translations")
      seconds = {beam_size: seconds[beam_size, True] for beam_size in BEAM_SIZES}
      ratios = [beam / greedy for greedy, beam in zip(seconds[1], seconds[4])]
      print(f"{testset} batch={batch_size}: beam 4 / greedy time = "
            f"{statistics.median(ratios):.2f} (median of {' '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
  from aiayn_flax.runtime import huge_pages
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? the environment's setting
  app.run(main)
