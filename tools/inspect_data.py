r"""Prints decoded training examples with their masks; optionally saves batches.

  python tools/inspect_data.py --config=configs/<name>.py --workdir=/tmp/run \
      [--num_batches=2] [--num_show=4] [--eval] [--save=/tmp/batches.npz]

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
from bert_jax.training import config_checks


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


def original_ids(batch):
  ids = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"] > 0)
  ids[rows, batch["masked_lm_positions"][rows, cols]] = (
      batch["masked_lm_ids"][rows, cols])
  return ids


def show(tok, batch, r):
  orig = original_ids(batch)[r]
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


def main(argv):
  del argv
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir
  config_checks.validate(config, num_devices=1)  # Before any file is written.
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
  for r in range(min(flags.FLAGS.num_show, batches[0]["input_ids"].shape[0])):
    show(tok, batches[0], r)
  if flags.FLAGS.save:
    arrays = {k: np.concatenate([b[k] for b in batches])
              for k in features.pretraining_spec(config.data)}
    orig = np.concatenate([original_ids(b) for b in batches])
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
