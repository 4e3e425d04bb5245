"""Zero-shot cloze classification: a task rephrased as fill-in-the-blank.

  python -m bert_jax.zero_shot --model WORKDIR_OR_HF_DIR --input dev.tsv \
      --template "{text} It was [MASK]." --verbalizer terrible,great \
      [--labels 0,1] [--text_field sentence] [--label_field label]

Each example fills the template ({text}, optionally {text_b}); the score of
a label is the MLM log-probability (softmax over the tokenizer's vocabulary)
of its verbalizer word at the [MASK]; the prediction is the best-scoring
label. No training: this asks what the pretrained MLM head already knows.
A text too long for the model is cut (its end, longest of text/text_b
first) so the template around it, [MASK] included, always survives.
"""

from __future__ import annotations

import csv
import json
import os
import re
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from bert_jax.downstream import embeddings
from bert_jax.downstream import mask_filling
from bert_jax.hf import mapping

MASK = "[MASK]"


def check_template(template: str) -> None:
  if template.count(MASK) != 1:
    raise ValueError(f"--template {template!r} must contain {MASK} exactly "
                     f"once (it has {template.count(MASK)}).")
  if "{text}" not in template:
    raise ValueError(f"--template {template!r} has no {{text}} placeholder.")


def parse_verbalizer(verbalizer) -> dict:
  """{label: word} from a mapping, a list (labels 0..n-1) or the CLI form
  'terrible,great' / 'neg:terrible,pos:great'. Labels become strings."""
  if isinstance(verbalizer, str):
    items = [w.strip() for w in verbalizer.split(",") if w.strip()]
    if all(":" in w for w in items):
      verbalizer = dict(w.split(":", 1) for w in items)
    else:
      verbalizer = items
  if not isinstance(verbalizer, Mapping):
    verbalizer = dict(enumerate(verbalizer))
  out = {str(k).strip(): str(v).strip() for k, v in verbalizer.items()}
  if len(out) < 2:
    raise ValueError(f"--verbalizer {verbalizer!r} needs a word for each of at "
                     "least two labels.")
  return out


def verbalizer_token_ids(tokenizer, words: Sequence[str]) -> list[int]:
  """Each word's single token id (as it appears after a space); a word the
  tokenizer splits into several pieces is a ValueError naming the pieces."""
  tok = embeddings.plain_tokenizer(tokenizer)
  ids = []
  for w in words:
    enc = tok.encode(w, add_special_tokens=False)
    if len(enc.ids) != 1:
      raise ValueError(
          f"Verbalizer word {w!r} is {len(enc.ids)} tokens {enc.tokens} for "
          "this tokenizer; each label needs a word that is a single token.")
    ids.append(enc.ids[0])
  if len(set(ids)) != len(ids):
    raise ValueError(f"Verbalizer words {list(words)} do not map to distinct "
                     "tokens.")
  return ids


_FIELDS = re.compile(r"\{text\}|\{text_b\}|\[MASK\]")


def fill(template: str, text: str, text_b: str | None, mask_token: str) -> str:
  """The template with its placeholders replaced in one pass (a text that
  contains '{text_b}' or braces is left as it is)."""
  if "{text_b}" in template and text_b is None:
    raise ValueError(f"--template {template!r} uses {{text_b}} but the "
                     "example has no text_b.")
  values = {"{text}": text, "{text_b}": text_b, MASK: mask_token}
  return _FIELDS.sub(lambda m: values[m.group(0)], template)


def encode_example(tok, template: str, text: str, text_b: str | None,
                   max_length: int, mask_token: str):
  """-> (encoding, truncated?). Drops tokens from the end of the longer of
  text / text_b until the filled template fits in `max_length`."""
  texts = {"text": text, "text_b": text_b}
  truncated = False
  while True:
    enc = tok.encode(fill(template, texts["text"], texts["text_b"],
                          mask_token))
    over = len(enc.ids) - max_length
    if over <= 0:
      return enc, truncated
    pieces = {k: tok.encode(v, add_special_tokens=False)
              for k, v in texts.items() if v and f"{{{k}}}" in template}
    key = max(pieces, key=lambda k: len(pieces[k].ids), default=None)
    if key is None or not pieces[key].ids:
      raise ValueError(f"--template {template!r} alone is longer than "
                       f"max_length={max_length} tokens.")
    p = pieces[key]
    keep = min(max(len(p.ids) - over, 0), len(p.ids) - 1)
    cut = texts[key][:p.offsets[keep - 1][1]] if keep else ""
    # Offsets always shrink the text; the guard only bounds the loop.
    texts[key] = cut if len(cut) < len(texts[key]) else texts[key][:-1]
    truncated = True


class ZeroShotClassifier:
  """A loaded model, template and verbalizer; call it on examples."""

  def __init__(self, loaded: embeddings.LoadedModel, template: str,
               verbalizer, *, batch_size: int = 32,
               max_length: int | None = None, source: str = "--model"):

    check_template(template)
    if mask_filling.MLM_HEAD in loaded.untrained_heads:
      raise ValueError(mask_filling.no_masked_lm_head(source))
    self.template = template
    self.verbalizer = parse_verbalizer(verbalizer)
    self.labels = list(self.verbalizer)
    self.tokenizer = loaded.tokenizer
    self.token_ids = verbalizer_token_ids(loaded.tokenizer,
                                          list(self.verbalizer.values()))
    self.max_length = embeddings.check_max_length(max_length,
                                                 loaded.model_config)
    self.batch_size = int(batch_size)
    if self.batch_size < 1:
      raise ValueError(f"batch_size={batch_size} must be positive.")
    self._tok = embeddings.plain_tokenizer(loaded.tokenizer)
    model = mapping.make_model(loaded.params, loaded.model_config,
                               loaded.table)
    graphdef, self._state = nnx.split(model)
    verbal = np.asarray(self.token_ids, np.int32)
    # Rows of a table padded past the tokenizer are no token: out of the
    # softmax, as in fill_mask and an export (hf.vocab).
    n = min(int(loaded.model_config.vocab_size),
            int(loaded.tokenizer.tokenizer.get_vocab_size()))

    @jax.jit
    def scores_fn(state, ids, mask, seg, pos):
      out = nnx.merge(graphdef, state)(ids, mask, seg, pos[:, None],
                                       deterministic=True)
      logp = jax.nn.log_softmax(
          out["mlm_logits"][:, 0, :n].astype("float32"))
      return logp[:, verbal]

    self._scores = scores_fn

  def encode(self, examples: Sequence[tuple]) -> tuple[list, int]:
    """-> (encodings, number truncated); each has exactly one [MASK]."""
    mask_token = self.tokenizer.mask_token
    mask_id = self.tokenizer.mask_token_id
    encs, n_truncated = [], 0
    for i, (text, text_b, _) in enumerate(examples):
      enc, cut = encode_example(self._tok, self.template, str(text),
                                None if text_b is None else str(text_b),
                                self.max_length, mask_token)
      n_masks = enc.ids.count(mask_id)
      if n_masks != 1:
        raise ValueError(f"Example {i} has {n_masks} {mask_token} tokens once "
                         f"filled into the template (text {text!r}); the "
                         "text itself must not contain one.")
      encs.append(enc)
      n_truncated += cut
    return encs, n_truncated

  def __call__(self, examples: Iterable[tuple]) -> dict:
    """examples: (text, text_b or None, label or None) -> dict(accuracy,
    predictions, scores [N, labels], labels, num_examples, num_truncated).
    Accuracy counts examples with a label (None when none has one)."""
    examples = list(examples)
    if not examples:
      raise ValueError("No examples to classify.")
    for i, (_, _, label) in enumerate(examples):
      if label is not None and str(label) not in self.verbalizer:
        raise ValueError(f"Example {i} has label {label!r}, which the "
                         f"verbalizer {self.verbalizer} does not name.")
    encs, n_truncated = self.encode(examples)
    lengths = [len(e.ids) for e in encs]
    scores = np.zeros((len(encs), len(self.labels)), np.float32)
    mask_id = self.tokenizer.mask_token_id
    for idx, length in embeddings.batches(
        lengths, self.batch_size, embeddings.bucket_lengths(self.max_length)):
      ids, mask = embeddings.pad_batch([encs[i].ids for i in idx],
                                      self.batch_size, length)
      seg, _ = embeddings.pad_batch([encs[i].type_ids for i in idx],
                                   self.batch_size, length)
      pos = np.zeros((self.batch_size,), np.int32)
      pos[:len(idx)] = [encs[i].ids.index(mask_id) for i in idx]
      scores[idx] = np.asarray(self._scores(self._state, ids, mask, seg,
                                            pos))[:len(idx)]
    predictions = [self.labels[j] for j in np.argmax(scores, axis=1)]
    gold = [None if l is None else str(l) for _, _, l in examples]
    right = [p == g for p, g in zip(predictions, gold) if g is not None]
    return dict(accuracy=float(np.mean(right)) if right else None,
                predictions=predictions, scores=scores, labels=self.labels,
                num_examples=len(examples), num_labeled=len(right),
                num_truncated=n_truncated)


def zero_shot_classify(model_path: str, examples: Iterable[tuple],
                       template: str, verbalizer, step: int | None = None,
                       batch_size: int = 32,
                       max_length: int | None = None) -> dict:
  """Load `model_path` (workdir, HF dir, imported dir) and classify."""
  check_template(template)
  clf = ZeroShotClassifier(embeddings.load_masked_lm(model_path, step),
                           template,
                           verbalizer, batch_size=batch_size,
                           max_length=max_length, source=model_path)
  return clf(examples)


# -----------------------------------------------------------------------------
# Input rows: files here; GLUE (TFDS) rows come through examples_from_rows.
# -----------------------------------------------------------------------------
def examples_from_rows(rows: Iterable[Mapping[str, Any]], text_field: str,
                       text_b_field: str | None = None,
                       label_field: str | None = "label"):
  """Rows (dicts: a file's records, TFDS GLUE examples, task_data output) ->
  (examples, bad): bad lists (row number, reason) for rows whose text is
  missing or blank.
  Bytes are decoded; a missing or empty label is None (unlabeled)."""

  def text_of(v):
    return v.decode("utf-8") if isinstance(v, bytes) else v

  examples, bad = [], []
  for n, row in enumerate(rows, 1):
    text = text_of(row.get(text_field))
    text_b = text_of(row.get(text_b_field)) if text_b_field else None
    missing = [f for f, v in ((text_field, text), (text_b_field, text_b))
               if f and (v is None or not str(v).strip())]
    if missing:
      bad.append((n, f"no {missing[0]!r} text"))
      continue
    label = row.get(label_field) if label_field else None
    label = text_of(label)
    if hasattr(label, "item"):
      label = label.item()
    examples.append((str(text), None if text_b is None else str(text_b),
                     None if label in (None, "") else label))
  return examples, bad


def read_rows(path: str) -> list[dict]:
  """.csv / .tsv (header row) or .jsonl records; a bad JSON line is an
  empty row (reported by examples_from_rows)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--input {path} does not exist.")
  ext = os.path.splitext(path)[1].lower()
  with open(path, encoding="utf-8", newline="") as f:
    if ext in (".csv", ".tsv"):
      return list(csv.DictReader(f, delimiter="\t" if ext == ".tsv" else ","))
    if ext in (".jsonl", ".json"):
      rows = []
      for line in f:
        if line.strip():
          try:
            row = json.loads(line)
          except json.JSONDecodeError:
            row = {}
          rows.append(row if isinstance(row, dict) else {})
      return rows
  raise ValueError(f"--input {path}: expected a .csv, .tsv or .jsonl file.")
