"""Do the exported models translate as ours? A trained run's test set through our decoding
(evaluate.py's parameters and search), CTranslate2 and transformers' generate (docs/EXPORT.md).

  python bench/export_agreement.py --workdir=runs/multi30k [--testset=multi30k/test2016]

Exports the run to both formats (under --out, default WORKDIR/export), then prints, for greedy
search: the share of sentences whose translation is the same string as ours and sacreBLEU for
ours, CTranslate2 float32, CTranslate2 int8, generate float32 with our layer norm epsilon and
generate as loaded (torch's 1e-5). Each greedy difference from ours in float32 is shown with
its margin: at the first token where the two differ, our log-probability of our token minus
that of theirs, the prefix before it shared (a near-tie is a margin of a few 1e-4 nats or
less). Beam 4: ours (GNMT length penalty, alpha 0.6) beside CTranslate2's nearest settings
(length_penalty 0.6, which divides by length**0.6). `--json=FILE` also writes the figures.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_string("testset", "multi30k/test2016", "A test set, as evaluate.py names them.")
flags.DEFINE_string("out", None, "Where the exported folders go (default: WORKDIR/export).")
flags.DEFINE_string("json", None, "Also write the figures to this file.")
flags.DEFINE_integer("show", 10, "Differences shown per engine.")
flags.DEFINE_integer("step", None, "The checkpoints ending at this step (default: the newest; "
                     "pin it while the run still trains).")
FLAGS = flags.FLAGS


def token_rows(translator, sentences):
  """Our greedy output ids (EOS included) of each sentence: the Translator's own batches."""
  def ids_to_eos(row, decoded):
    ids = [int(t) for t in decoded[row]]
    return ids[:ids.index(1) + 1] if 1 in ids else ids
  return translator._translate(sentences, 0, ids_to_eos, [])  # noqa: SLF001


def margin(model, params, source_ids, ours, theirs):
  """At the first position where the id lists differ: (position, our log-prob of our token
  minus that of theirs), our model teacher-forced on the shared prefix."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from aiayn_flax.data import vocabulary
  position = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                  min(len(ours), len(theirs)))
  if position >= min(len(ours), len(theirs)):
    return position, float("nan")
  targets = np.array([ours[:position + 1]], np.int32)
  logits = model.apply({"params": params}, jnp.asarray([source_ids + [vocabulary.EOS_ID]]),
                       jnp.asarray(targets))
  log_probs = np.asarray(jax.nn.log_softmax(logits[0, position]))
  return position, float(log_probs[ours[position]] - log_probs[theirs[position]])


def main(argv):
  del argv
  import sentencepiece as spm
  from aiayn_flax import run_dir, scoring, tasks
  from aiayn_flax.data import vocabulary
  from aiayn_flax.export import engines, exporter
  from aiayn_flax.translator import Translator
  config, model, params, steps = exporter.load_run(FLAGS.workdir, step=FLAGS.step)
  sources, references = run_dir.testset_pairs(FLAGS.testset, config, tasks.for_config(config))
  out = FLAGS.out or os.path.join(FLAGS.workdir, "export")
  folders = {f: os.path.join(out, f) for f in exporter.WRITERS}
  for output_format, folder in folders.items():  # always written: never an older run's
    exporter.write_export(FLAGS.workdir, config, params, steps, output_format, folder)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  translator = lambda beam: Translator(  # noqa: E731
      model, params, vocab, beam_size=beam, alpha=config.length_penalty_alpha,
      extra_length=config.decode_extra_length, batch_size=config.decode_batch_size)
  greedy = translator(1)
  ours = greedy.translate(sources)
  ct2 = engines.CTranslate2Engine(folders["ctranslate2"])
  ct2_int8 = engines.CTranslate2Engine(folders["ctranslate2"], compute_type="int8")
  marian = engines.MarianEngine(folders["marian"])
  marian_as_loaded = engines.MarianEngine(folders["marian"], patch_epsilon=False)
  outputs = {"ours": ours, "ctranslate2 f32": ct2.translate(sources),
             "ctranslate2 int8": ct2_int8.translate(sources),
             "generate f32": marian.translate(sources),
             "generate f32, epsilon 1e-5": marian_as_loaded.translate(sources)}
  bleu = lambda hyps: scoring.sacrebleu_scores(hyps, references)["bleu"]["score"]  # noqa: E731
  pieces = spm.SentencePieceProcessor(model_file=os.path.join(folders["ctranslate2"],
                                                              "sentencepiece.model"))
  report = {"testset": FLAGS.testset, "sentences": len(sources), "checkpoint_steps": steps,
            "greedy": {}, "differences": {}}
  print(f"{FLAGS.testset}, {len(sources)} sentences, parameters of steps {steps}; greedy:")
  for name, hyps in outputs.items():
    same = sum(a == b for a, b in zip(ours, hyps))
    report["greedy"][name] = {"identical": same, "sacrebleu": round(bleu(hyps), 2)}
    print(f"  {name:28s} identical to ours {same}/{len(sources)} "
          f"({100 * same / len(sources):.2f}%)  sacreBLEU {bleu(hyps):.2f}")
  for name in ("ctranslate2 f32", "generate f32"):
    differing = [i for i, (a, b) in enumerate(zip(ours, outputs[name])) if a != b]
    ours_ids = token_rows(greedy, [sources[i] for i in differing])
    rows = []
    for i, our_ids in zip(differing, ours_ids):
      their_ids = pieces.encode(outputs[name][i]) + [vocabulary.EOS_ID]  # their text's pieces
      position, nats = margin(model, params, vocab.encode(sources[i]), our_ids, their_ids)
      rows.append({"line": i, "position": position, "margin_nats": nats,
                   "ours": ours[i], "theirs": outputs[name][i]})
    report["differences"][name] = rows
    for row in rows[:FLAGS.show]:
      print(f"  {name} line {row['line']}: at token {row['position']} margin "
            f"{row['margin_nats']:.2e} nats\n    ours:   {row['ours']}\n"
            f"    theirs: {row['theirs']}")
  beam = {"ours (GNMT alpha 0.6)": translator(4).translate(sources),
          "ctranslate2 f32 (length_penalty 0.6)": ct2.translate(sources, beam_size=4)}
  report["beam4"] = {name: round(bleu(hyps), 2) for name, hyps in beam.items()}
  print("beam 4: " + "; ".join(f"{n} sacreBLEU {b:.2f}" for n, b in report["beam4"].items()))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=2, ensure_ascii=False)


if __name__ == "__main__":
  app.run(main)
