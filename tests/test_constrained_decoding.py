"""Decoding that can only write trees over the input's words (parsing/constrained.py): whatever
the model's scores, greedy and beam search write well-formed trees over exactly the input;
every gold tree of the sample is one they may write; and the hook changes nothing when the
constraint changes nothing."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from aiayn_flax import decoding
from aiayn_flax.data import vocabulary
from aiayn_flax.parsing import constrained, linearize, sentences

EOS = vocabulary.EOS_ID
# A vocabulary as the parsing task's: special ids, tree tokens, word pieces (U+2581 starts a
# word; "▁" alone, then "x", is how SentencePiece spells a word it has no piece for).
PIECES = ["<pad>", "</s>", "<unk>", "<s>", "▁(S", "▁(NP", "▁(VP", "▁(PP", "▁)", "▁XX",
          "▁the", "▁dog", "▁bark", "s", "ed", "▁at", "▁cat", "▁", "x", "<0x28>"]
ID = {piece: i for i, piece in enumerate(PIECES)}
WORD_STARTS = ["▁the", "▁dog", "▁bark", "▁at", "▁cat", "▁"]
CONTINUATIONS = ["s", "ed", "x", "<0x28>"]


def random_sources(seed: int, count: int, max_words: int) -> list[list[int]]:
  """Random sentences as piece ids: each word a word-start piece and 0-2 continuations."""
  rng = np.random.RandomState(seed)
  sources = []
  for _ in range(count):
    pieces = []
    for _ in range(rng.randint(1, max_words + 1)):
      pieces.append(ID[WORD_STARTS[rng.randint(len(WORD_STARTS))]])
      pieces += [ID[CONTINUATIONS[rng.randint(len(CONTINUATIONS))]]
                 for _ in range(rng.randint(3) if pieces[-1] != ID["▁"] else 1)]
    sources.append(pieces)
  return sources


def padded_sources(sources) -> np.ndarray:
  """int32[B, S]: pieces, EOS, PAD after (as the translator feeds the encoder)."""
  inputs = np.zeros((len(sources), max(map(len, sources)) + 1), np.int32)
  for row, pieces in enumerate(sources):
    inputs[row, :len(pieces) + 1] = pieces + [EOS]
  return inputs


def random_model(seed: int, bias_to_end: float):
  """A decoding callback with pseudo-random logits per (row, position, previous token), EOS
  and `)` raised by bias_to_end (a model that wants to stop early), and its initial cache."""
  key = jax.random.PRNGKey(seed)
  end_bias = jnp.zeros(len(PIECES)).at[EOS].set(bias_to_end).at[ID["▁)"]].set(bias_to_end)

  def tokens_to_logits(ids, cache):
    def row_logits(row, position, last):
      row_key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, row), position),
                                   last)
      return 2.0 * jax.random.normal(row_key, (len(PIECES),))
    logits = jax.vmap(row_logits)(cache["row"], cache["position"], ids[:, 0])  # [N, V]
    return logits + end_bias, dict(cache, position=cache["position"] + 1)

  return tokens_to_logits


@functools.partial(jax.jit, static_argnames=("leaves", "beam_size", "constrain", "seed",
                                              "bias_to_end"))
def decode(inputs, leaves, beam_size, constrain=True, seed=0, bias_to_end=2.0):
  tokens = constrained.TreeTokens(PIECES, leaves)
  rows = inputs.shape[0]
  cache = {"row": jnp.arange(rows), "position": jnp.zeros(rows, jnp.int32)}
  max_decode_len = 4 * inputs.shape[1] + 8
  max_lengths = jnp.full((rows,), max_decode_len)
  constraint = tokens.constrain_log_probs(inputs, max_lengths) if constrain else None
  model = random_model(seed, bias_to_end)
  if beam_size == 1:
    return decoding.greedy_decode(model, cache, max_lengths, max_decode_len, vocabulary.BOS_ID,
                                  EOS, constrain_log_probs=constraint)
  sequences, _ = decoding.beam_search(model, cache, max_lengths, max_decode_len,
                                      vocabulary.BOS_ID, EOS, beam_size, 0.6,
                                      num_results=beam_size, constrain_log_probs=constraint)
  return sequences  # [B, K, L]: every hypothesis returned, not only the best


def tree_problems(row: np.ndarray, source: list[int], leaves: str) -> list[str]:
  """What makes a decoded row (ids, EOS, PAD) other than a tree over exactly `source`."""
  ids = list(row)
  if EOS not in ids:
    return ["no EOS"]
  pieces = [PIECES[i] for i in ids[:ids.index(EOS)]]
  problems, depth = [], 0
  for i, piece in enumerate(pieces):
    if piece.startswith("▁(") or piece == "▁)":
      if i + 1 < len(pieces) and pieces[i + 1] in CONTINUATIONS:
        problems.append(f"a bracket inside a word at {i}")
      if piece == "▁)" and i and pieces[i - 1].startswith("▁("):
        problems.append(f"an empty constituent at {i}")
      depth += 1 if piece != "▁)" else -1
      if depth == 0 and i + 1 < len(pieces):
        problems.append(f"the root closed at {i}, before the end")
    elif depth == 0:
      problems.append(f"a word outside every bracket at {i}")
  if depth:
    problems.append(f"{depth} brackets left open")
  written = [p for p in pieces if not p.startswith("▁(") and p != "▁)"]
  expected = ([PIECES[i] for i in source] if leaves == "words"
              else ["▁XX" for i in source if PIECES[i].startswith("▁")])
  if written != expected:
    problems.append(f"wrote {written}, not {expected}")
  return problems


@pytest.mark.parametrize("leaves", linearize.LEAVES)
@pytest.mark.parametrize("beam_size", [1, 3])
def test_decoding_writes_only_trees_over_the_input_whatever_the_scores(leaves, beam_size):
  """A model that prefers to close brackets and stop: unconstrained, most of its outputs are
  not trees over the input; constrained, every hypothesis is one."""
  sources = random_sources(seed=0, count=24, max_words=7)
  inputs = padded_sources(sources)
  for constrain in (False, True):
    sequences = np.asarray(decode(inputs, leaves, beam_size, constrain))
    rows = sequences.reshape(len(sources), -1, sequences.shape[-1])  # [B, K, L]
    bad = [(b, k, tree_problems(rows[b, k], sources[b], leaves))
           for b in range(len(sources)) for k in range(rows.shape[1])
           if tree_problems(rows[b, k], sources[b], leaves)]
    if constrain:
      assert bad == []
    else:
      assert len(bad) > len(sources) * rows.shape[1] // 2


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_constraint_that_changes_nothing_changes_no_token(beam_size):
  """The hook itself (log-softmax for greedy search, the must-end rule) alters nothing."""
  cache = {"row": jnp.arange(8), "position": jnp.zeros(8, jnp.int32)}
  model = random_model(seed=1, bias_to_end=0.5)
  lengths = jnp.array([3, 5, 8, 13, 21, 30, 30, 30])  # some hit their limit
  for search in ([decoding.greedy_decode] if beam_size == 1 else
                 [functools.partial(decoding.beam_search, beam_size=beam_size, num_results=2)]):
    unchanged = lambda log_probs, sequences, step: log_probs  # noqa: E731
    plain = search(model, cache, lengths, 30, vocabulary.BOS_ID, EOS)
    hooked = search(model, cache, lengths, 30, vocabulary.BOS_ID, EOS,
                    constrain_log_probs=unchanged)
    jax.tree.map(np.testing.assert_array_equal, plain, hooked)


def test_writing_any_word_writes_the_next_one_with_all_the_words_probability():
  """With words as leaves the decoder chooses between brackets and "a word": the next piece
  gets the probability of every word piece; other pieces, and brackets that would split a
  word or close the root early, get none."""
  tokens = constrained.TreeTokens(PIECES, "words")
  source = [ID["▁dog"], ID["s"], ID["▁bark"]]
  log_probs = jnp.log(jnp.full((1, 1, len(PIECES)), 1 / len(PIECES)))
  constrain = tokens.constrain_log_probs(jnp.asarray(padded_sources([source])), jnp.array([20]))
  written = ["▁(S", "▁(NP", "▁dog"]  # "s" must come next, inside the word
  sequences = jnp.asarray([[[ID[p] for p in written] + [0] * 16]])
  constrained_log_probs = np.asarray(constrain(log_probs, sequences, jnp.array(3)))[0, 0]
  word_pieces = [i for i, p in enumerate(PIECES) if p not in ("<pad>", "</s>", "<s>")
                 and not p.startswith("▁(")
                 and p not in ("▁)", "▁XX")]
  assert np.isfinite(constrained_log_probs).sum() == 1
  np.testing.assert_allclose(np.exp(constrained_log_probs[ID["s"]]),
                             len(word_pieces) / len(PIECES), rtol=1e-6)
  written = ["▁(S", "▁(NP", "▁dog", "s"]  # at a word's start: open, close NP, or "▁bark"
  sequences = jnp.asarray([[[ID[p] for p in written] + [0] * 16]])
  allowed = np.isfinite(np.asarray(constrain(log_probs, sequences, jnp.array(4)))[0, 0])
  assert sorted(PIECES[i] for i in np.flatnonzero(allowed)) == [
      "▁(NP", "▁(PP", "▁(S", "▁(VP", "▁)", "▁bark"]


def gold_steps_allowed(tokens: constrained.TreeTokens, sources, targets) -> np.ndarray:
  """bool[B, L]: whether the constraint allows target[b, t] after target[b, :t] (PAD
  positions: True)."""
  sources, targets = jnp.asarray(sources), jnp.asarray(targets)
  constrain = tokens.constrain_log_probs(sources, jnp.full(sources.shape[:1], 10_000))
  uniform = jnp.zeros((targets.shape[0], 1, len(tokens.opens)))
  positions = jnp.arange(targets.shape[1])

  @jax.jit
  def allowed_at(step):
    so_far = jnp.where(positions < step, targets, 0)[:, None, :]  # [B, 1, L]
    log_probs = constrain(uniform, so_far, step)[:, 0]  # [B, V]
    gold = targets[:, step]  # [B]
    return (gold == 0) | jnp.isfinite(jnp.take_along_axis(log_probs, gold[:, None], 1)[:, 0])

  return np.stack([np.asarray(allowed_at(step)) for step in range(targets.shape[1])], axis=1)


@pytest.mark.parametrize("leaves", linearize.LEAVES)
def test_every_gold_tree_of_the_sample_is_one_the_decoder_may_write(shared_data, tmp_path,
                                                                    leaves):
  """With the sample config's real vocabulary, each gold target of the validation and test
  files (pieces, then EOS) is allowed at every step: the constraint never rules out the
  right tree. The one tree whose label (WHADJP) no training tree has is left out: its label
  is spelled in several pieces, which read as words."""
  from aiayn_flax import tasks
  from aiayn_flax.data import pipeline
  from configs import parsing_sample
  config = parsing_sample.get_config()
  config.dataset.tree_leaves = leaves
  vocab = pipeline.vocabulary_for(config, str(tmp_path), tasks.for_config(config))
  tokens = constrained.TreeTokens([vocab.piece(i) for i in range(vocab.vocab_size)], leaves)
  labels = set(sentences.tree_tokens(config.dataset))
  dataset = ml_collections.ConfigDict(dict(treebank_dir="", tree_leaves=leaves))
  checked = unknown_labels = 0
  for split in ("validation", "test"):
    pairs = list(zip(*sentences.text_pairs(dataset, split)))
    known = [(s, t) for s, t in pairs
             if all(linearize.open_label(w) is None or w in labels for w in t.split())]
    unknown_labels += len(pairs) - len(known)
    sources = padded_sources([vocab.encode(s) for s, _ in known])
    targets = padded_sources([vocab.encode(t) for _, t in known])
    allowed = gold_steps_allowed(tokens, sources, targets)
    assert allowed.all(), f"{split}: {np.flatnonzero(~allowed.all(1)).tolist()} not allowed"
    checked += len(known)
  assert (checked, unknown_labels) == (273 + 245 - 1, 1)


def test_the_dry_run_compiles_a_parsing_run_with_its_constrained_decoding(monkeypatch):
  """`train.py --dry_run --target=...` compiles evaluate.py's decoding as a parsing run runs
  it, constraint included: the same compile without it counts fewer FLOPs."""
  from aiayn_flax.planning import compiled_plan
  from aiayn_flax import tasks
  from configs import parsing_sample
  config = parsing_sample.get_config()
  config.model.update(vocab_size=512, d_model=32, d_ff=64, num_layers=1)
  # One bucket: with several, the dry run compiles two buckets' training step to choose one,
  # though only the decoding is asked for here.
  config.dataset.update(max_length=32, bucket_min_length=32)
  config.update(beam_size=2, decode_extra_length=16)  # few decoding stages: a faster compile

  def evaluate_flops():
    plan = compiled_plan.compile_run(config, "tpu-v5e-1", include=("evaluate",))
    (program,) = plan["programs"]
    return program.flops

  # A constrained search is never compacted; the plain one's second loop (after compaction) is
  # left out of both compiles, so that the constraint is their one difference (with it in, a
  # decoding compiled without its constraint counted more FLOPs than the plain one anyway).
  monkeypatch.setattr(compiled_plan.translator, "compacted_rows", lambda rows, devices=1: 0)
  constrained_flops = evaluate_flops()
  monkeypatch.setattr(tasks.Parsing, "decoding_constraint", lambda self, vocab: None)
  assert constrained_flops > evaluate_flops() > 0
