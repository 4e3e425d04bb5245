r"""Prints decoded training examples with their masks; optionally saves batches.

  python tools/inspect_data.py --config=configs/<name>.py --workdir=/tmp/run \
      [--num_batches=2] [--num_show=4] [--eval] [--save=/tmp/batches.npz] \
      [--phase=N]

--phase N reads the pipeline of the run's N-th phase (1-based: its shapes
and "data" fields, train.phases). It prints what the batches hold as
measured: the mask rate (predicted positions over the real tokens that are
not special) against data.mask_rate, and, with several sources, the
examples each gave against their mixing weights.

In the printout a masked position shows as ``[MASK:orig]`` (replaced by
[MASK]), ``{new:orig}`` (replaced by a random token) or ``<orig>`` (selected,
kept). --save writes the raw batches (concatenated along the batch axis) under
the standard BERT feature names, plus the scalars vocab_size, cls_token_id,
sep_token_id, mask_token_id, pad_token_id and a boolean array word_start
(True where a token of the original, unmasked input begins a word).
"""

import numpy as np
from absl import flags

from bert_jax import cli
from bert_jax.data import features
from bert_jax.data import pipeline
from bert_jax.data import tokenizers
from bert_jax.data import iterator
from bert_jax.data import masking
from bert_jax.data import sources as data_sources
from bert_jax.training import config_checks
from bert_jax.training import phases as phases_lib


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file.", argv=argv, **define)
  cli.define_workdir("Where the tokenizer (and demo corpus) go.",
                     default="/tmp/bert_jax_inspect", **define)
  flags.DEFINE_integer("num_batches", 1, "Batches to read.", **define)
  flags.DEFINE_integer("num_show", 3, "Examples to print.", **define)
  flags.DEFINE_bool("eval", False, "Read the eval batches instead.", **define)
  flags.DEFINE_string("save", "", "Write the batches to this .npz.", **define)
  flags.DEFINE_integer("phase", 0, "Read phase N's pipeline (1-based; 0: "
                       "the run's data fields).", **define)


def show(tok, batch, r):
  orig = masking.unmasked_ids(batch)[r]
  cur = batch["input_ids"][r]
  sel = set(batch["masked_lm_positions"][r][batch["masked_lm_weights"][r] > 0]
            .tolist())
  n = int(batch["input_mask"][r].sum())
  out = []
  for i in range(n):
    o = tok.id_to_piece(int(orig[i]))
    if i in sel:
      c = tok.id_to_piece(int(cur[i]))
      if cur[i] == tok.mask_id:
        out.append(f"[MASK:{o}]")
      elif cur[i] == orig[i]:
        out.append(f"<{o}>")
      else:
        out.append(f"{{{c}:{o}}}")
    else:
      out.append(o)
  seg = batch["segment_ids"][r][:n]
  if "sequence_ids" in batch:  # A packed row: its examples, their labels.
    k = int(batch["next_sentence_weights"][r].sum())
    starts = batch["cls_positions"][r][:k].tolist()
    labels = batch["next_sentence_labels"][r][:k].tolist()
    print(f"--- row {r}: {n} tokens in {k} packed examples starting at "
          f"{starts}, {len(sel)} predicted, next_sentence_labels={labels}")
  else:
    print(f"--- example {r}: {n} tokens, {len(sel)} predicted, "
          f"next_sentence_label={int(batch['next_sentence_labels'][r])}, "
          f"segment B starts at {int(np.argmax(seg)) if seg.any() else '-'}")
  print(" ".join(out))
  print("text:", tok.decode(orig[:n]))


def mask_rate(tok, batches) -> float:
  """Predicted positions over the real tokens that are not special."""
  special = np.zeros(max(tok.vocab_size, 1), bool)
  special[[i for i in tok.special_ids if 0 <= i < tok.vocab_size]] = True
  masked = sum(float(b["masked_lm_weights"].sum()) for b in batches)
  maskable = sum(int(((b["input_mask"] > 0) & ~special[masking.unmasked_ids(b)])
                     .sum()) for b in batches)
  return masked / max(maskable, 1)


def print_measured(config, tok, batches, stats, workdir) -> None:
  print(f"mask rate: {100 * mask_rate(tok, batches):.2f}% of the maskable "
        f"tokens (data.mask_rate {100 * config.data.mask_rate:g}%)")
  counts = {k[len(iterator.SOURCE_PREFIX):]: v for k, v in stats.items()
            if k.startswith(iterator.SOURCE_PREFIX)}
  if counts:
    plan = data_sources.plan(config.data, workdir)
    weights = data_sources.mixing_weights(
        plan.train, float(config.data.source_temperature),
        config.data.tfds_data_dir)
    total = max(sum(counts.values()), 1)
    for source, weight in zip(plan.train, weights):
      n = counts.get(source.name, 0)
      print(f"examples from {source.name}: {n} ({100 * n / total:.1f}%; "
            f"weight {100 * weight:.1f}%)")


def main(argv):
  del argv
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir
  phases = config_checks.validate(config, num_devices=1)  # Before writing.
  if flags.FLAGS.phase:
    if not 1 <= flags.FLAGS.phase <= len(phases):
      raise ValueError(f"--phase={flags.FLAGS.phase}: the run has "
                       f"{len(phases)} phase(s).")
    config = phases_lib.phase_config(config, phases[flags.FLAGS.phase - 1])
  tok = tokenizers.load_tokenizer(config.data, workdir)
  config_checks.check_tokenizer(config, tok)
  print(repr(tok))
  if flags.FLAGS.eval:
    config.data.num_eval_batches = flags.FLAGS.num_batches
    batches = pipeline.create_eval_batches(config, tok, workdir)
  else:
    it = pipeline.create_train_iterator(config, tok, workdir)
    batches = [next(it) for _ in range(flags.FLAGS.num_batches)]
    print("data counters:", it.stats)
    print_measured(config, tok, batches, it.stats, workdir)
  for r in range(min(flags.FLAGS.num_show, batches[0]["input_ids"].shape[0])):
    show(tok, batches[0], r)
  if flags.FLAGS.save:
    arrays = {k: np.concatenate([b[k] for b in batches])
              for k in features.pretraining_spec(config.data)}
    orig = np.concatenate([masking.unmasked_ids(b) for b in batches])
    arrays["word_start"] = tok.word_start[orig] & (arrays["input_mask"] > 0)
    arrays.update(vocab_size=np.int32(tok.vocab_size),
                  cls_token_id=np.int32(tok.cls_id),
                  sep_token_id=np.int32(tok.sep_id),
                  mask_token_id=np.int32(tok.mask_id),
                  pad_token_id=np.int32(tok.pad_id))
    np.savez(flags.FLAGS.save, **arrays)
    print(f"Saved {len(batches)} batches to {flags.FLAGS.save}: "
          f"{sorted(arrays)}")


if __name__ == "__main__":
  cli.run(main, define_flags)
