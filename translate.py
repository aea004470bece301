"""Translate sentences with a trained run: exactly one output line per input line.

  echo "A man is riding a bike." | python translate.py --workdir=runs/multi30k
  python translate.py --workdir=runs/multi30k --input=in.en --output=out.de
  python translate.py --workdir=runs/multi30k --input=in.en --nbest=4

Lines are split at "\\n" only (carriage returns before it are dropped), from standard input
and from --input alike, as every text file of the project is, so any UTF-8 text keeps its line
count: an empty or blank line gives an empty line, a last line without "\\n" is translated,
other line or paragraph separators stay inside their line. Lines are translated as they arrive:
an interactive user gets each line back at once, and a file or a pipe is decoded in full
batches (--buffer_size lines sorted by length, --batch_size sentences or --max_tokens padded
source tokens per decoding batch on each device).

The defaults are evaluate.py's: the run's beam size and alpha, the last
config.average_last_checkpoints checkpoints averaged.

On a pod slice or several GPU hosts, run it on every worker with --input and --output: the
processes join (jax.distributed), process 0 reads --input and hands the lines to the others (only
its disk needs the file), every batch is decoded over all their devices, and process 0 writes
the output. Standard input is refused there (each worker would read its own).

--nbest=N prints the N best translations of each line (N <= beam size), N lines per input line:
  LINE ||| TRANSLATION ||| SCORE
LINE counts input lines from 0 (Moses' n-best format); SCORE is the beam's ranking score,
log P(translation | source) / ((5 + length) / 6)^alpha, best first. An empty input line gives
no n-best line.
"""
import os
import select
import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A run's directory (checkpoints, vocabulary, config).")
flags.DEFINE_string("input", None, "Input file (default: standard input).")
flags.DEFINE_string("output", None, "Output file (default: standard output).")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's config; 1 is greedy).")
flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the run's config).")
flags.DEFINE_integer("average_last", None, "Average the last N checkpoints' parameters "
                     "(default: the run's config, as evaluate.py).")
flags.DEFINE_integer("batch_size", None, "Most sentences per decoding batch on each device "
                     "(default: the run's config.decode_batch_size, also per device).")
flags.DEFINE_integer("max_tokens", 0, "Most padded source tokens per decoding batch on each "
                     "device (0: only --batch_size limits it).")
flags.DEFINE_integer("buffer_size", 1024, "Most input lines read before translating them.")
flags.DEFINE_integer("nbest", None, "Print the N best translations with their scores.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def line_batches(stream, name: str, max_lines: int, waits_for_input: bool):
  """Lists of the lines of a binary stream, split and decoded as every text file of the project
  is (text_files.decode_line: at b"\\n", carriage returns before it removed, invalid UTF-8
  named by line). A list ends at max_lines or, when `waits_for_input` (a terminal or a pipe),
  as soon as no more input is waiting, so that what was typed is translated now."""
  from aiayn_flax.data.text_files import decode_line
  fd = stream.fileno() if waits_for_input else None
  pending, lines, number = b"", [], 0

  while True:
    if lines and (len(lines) >= max_lines
                  or (fd is not None and not select.select([fd], [], [], 0)[0])):
      yield lines[:max_lines]
      lines = lines[max_lines:]
      continue
    chunk = os.read(fd, 1 << 16) if fd is not None else stream.read1(1 << 16)
    if not chunk:
      break
    *complete, pending = (pending + chunk).split(b"\n")
    for raw in complete:
      number += 1
      lines.append(decode_line(raw, name, number))
  if pending:  # a last line without "\n"
    number += 1
    lines.append(decode_line(pending, name, number))
  while lines:
    yield lines[:max_lines]
    lines = lines[max_lines:]


def input_batches(source, name: str):
  """line_batches of the input (a binary stream, or the lines process 0 read: `input_lines`)."""
  if isinstance(source, list):
    for start in range(0, len(source), FLAGS.buffer_size):
      yield source[start:start + FLAGS.buffer_size]
    return
  yield from line_batches(source, name, FLAGS.buffer_size, waits_for_input=not FLAGS.input)


def input_lines(path: str) -> list[str]:
  """Every line of --input, read by process 0 and handed to the others (their disks may not
  hold the file, or hold another one). A file process 0 cannot read stops every process, in
  one line naming it, before any model is loaded."""
  from aiayn_flax.runtime import process_zero

  def read():
    try:
      with open(path, "rb") as f:
        return [line for batch in line_batches(f, path, FLAGS.buffer_size, False)
                for line in batch]
    except OSError as e:
      raise FileNotFoundError(f"--input={path}: {e.strerror}") from None
  return process_zero.read_once(f"--input={path}", read)


def one_line(text: str) -> str:
  """A translation as one output line, whatever characters the vocabulary can produce."""
  return " ".join(text.splitlines()) if "\n" in text or "\r" in text else text


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from aiayn_flax.runtime.tensorflow_setup import keep_tensorflow_off_accelerators
  keep_tensorflow_off_accelerators()  # before any tf.data work: TF must not take GPU memory
  try:
    import jax
    from aiayn_flax.runtime import cluster
    from aiayn_flax import run_dir, sharding, tasks
    from aiayn_flax.runtime import compilation_cache
    from aiayn_flax.translator import Translator
    cluster.initialize_distributed()  # launched on every worker: join the others first
    if jax.process_count() > 1:
      if not FLAGS.input:
        raise ValueError(f"on {jax.process_count()} processes, give --input (a file process 0 "
                         "reads) and --output, or run on one host for standard input")
      source = input_lines(FLAGS.input)  # first: a missing file stops every process at once
    from aiayn_flax.runtime import host_agreement
    # Every host reads the run's config: one that cannot (a workdir it does not see) stops all.
    config = host_agreement.on_every_host("the run's config",
                                          lambda: run_dir.load_config(FLAGS.workdir))
    compilation_cache.enable(config, FLAGS.workdir)  # reuse what train.py compiled
    task = tasks.for_config(config)
    average_last = FLAGS.average_last or config.average_last_checkpoints
    model, params, _ = run_dir.load_model_and_params(FLAGS.workdir, config, average_last)
    vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
    translator = Translator(
        model, params, vocab, beam_size=FLAGS.beam_size or config.beam_size,
        alpha=config.length_penalty_alpha if FLAGS.alpha is None else FLAGS.alpha,
        extra_length=config.decode_extra_length,
        # Both per device, as fairseq's --batch-size and --max-tokens are per GPU.
        batch_size=sharding.over_decoding_devices(
            FLAGS.batch_size or config.decode_batch_size),
        max_tokens=sharding.over_decoding_devices(FLAGS.max_tokens),
        max_positions=config.model.max_positions if config.model.positions == "learned" else None,
        num_results=FLAGS.nbest, constraint_for=task.decoding_constraint(vocab))
    if jax.process_count() == 1:
      source = open(FLAGS.input, "rb") if FLAGS.input else sys.stdin.buffer
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"translate.py: error: {e}")
  name = FLAGS.input or "<stdin>"
  first_line = 0
  try:
    if jax.process_index() > 0:  # every process has every translation; process 0 writes them
      out = open(os.devnull, "w", encoding="utf-8")
    else:
      out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
  except OSError as e:
    sys.exit(f"translate.py: error: {write_error(e, first_line)}")
  try:
    for lines in input_batches(source, name):
      if FLAGS.nbest:
        for offset, nbest in enumerate(translator.translate_nbest(lines)):
          texts = task.outputs([lines[offset]] * len(nbest), [text for text, _ in nbest])
          out.writelines(f"{first_line + offset} ||| {one_line(text)} ||| {score:.4f}\n"
                         for text, (_, score) in zip(texts, nbest))
      else:
        texts = task.outputs(lines, translator.translate(lines))  # trees, for a parser
        out.writelines(one_line(text) + "\n" for text in texts)
      out.flush()
      first_line += len(lines)
  except ValueError as e:
    sys.exit(f"translate.py: error: {e}")
  except OSError as e:  # --output could not be written (a full disk, a read-only folder)
    sys.exit(f"translate.py: error: {write_error(e, first_line)}")
  finally:
    if out is not sys.stdout:
      try:
        out.close()
      except OSError:
        pass  # (the write's own error is the one reported)


def write_error(error: OSError, lines_written: int) -> str:
  """One line for a failed write of --output, or the error itself when it is not one."""
  from aiayn_flax.runtime import storage_errors
  failure = storage_errors.write_failure(
      error, FLAGS.output or "<stdout>",
      f"the first {lines_written} translations are written there")
  if failure is None:
    raise error
  return str(failure)


if __name__ == "__main__":
  from aiayn_flax.runtime import garbage_collection, huge_pages
  garbage_collection.collect_less_often()  # before JAX's imports (fewer collections)
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? (set from outside: no restart)
  app.run(main)
