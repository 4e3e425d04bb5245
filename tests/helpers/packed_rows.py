"""Packed rows built in numpy, independently of bert_jax/data/packing.py.

`examples(seed, ...)` draws pretraining examples ([CLS] A [SEP] B [SEP],
token types, masked positions, a pair label); `padded(...)` lays them one a
row (the layout without packing) and `packed(...)` several a row, in order,
a new row when the next does not fit (features.PACKED_PRETRAINING). The same
examples in both layouts let a test compare a model's outputs, losses and
gradients example by example (`assert_same_loss_and_grads`: the whole
batch's). `synthetic_batch` is a random packed batch of the shapes a config
asks for (for the multi-device checks).
"""

from __future__ import annotations

import numpy as np

CLS, SEP = 2, 3


def examples(seed: int, lengths, preds: int, vocab: int) -> list[dict]:
  """One example per length: ids (CLS first, SEPs after A and B), token
  types (1 on B and its SEP), `preds` masked positions (some weight 0), a
  pair label."""
  r = np.random.RandomState(seed)
  out = []
  for n in lengths:
    ids = r.randint(5, vocab, n)
    a = max(1, (n - 3) // 2)
    ids[0], ids[a + 1], ids[n - 1] = CLS, SEP, SEP
    types = (np.arange(n) > a + 1).astype(np.int32)
    choices = [i for i in range(1, n) if ids[i] not in (CLS, SEP)]
    k = min(preds, len(choices))
    pos = np.sort(r.choice(choices, k, replace=False))
    weights = (r.rand(k) > 0.2).astype(np.float32)
    weights[:1] = 1.0
    out.append(dict(input_ids=ids.astype(np.int32), segment_ids=types,
                    positions=pos.astype(np.int32),
                    masked_ids=r.randint(5, vocab, k).astype(np.int32),
                    weights=weights, label=int(r.randint(0, 2))))
  return out


def padded(exs, seq: int, preds: int) -> dict:
  """One example a row, padded at the end (features.PRETRAINING)."""
  b = len(exs)
  out = dict(input_ids=np.zeros((b, seq), np.int32),
             input_mask=np.zeros((b, seq), np.int32),
             segment_ids=np.zeros((b, seq), np.int32),
             masked_lm_positions=np.zeros((b, preds), np.int32),
             masked_lm_ids=np.zeros((b, preds), np.int32),
             masked_lm_weights=np.zeros((b, preds), np.float32),
             next_sentence_labels=np.zeros((b,), np.int32))
  for i, ex in enumerate(exs):
    n, k = len(ex["input_ids"]), len(ex["positions"])
    out["input_ids"][i, :n] = ex["input_ids"]
    out["input_mask"][i, :n] = 1
    out["segment_ids"][i, :n] = ex["segment_ids"]
    out["masked_lm_positions"][i, :k] = ex["positions"]
    out["masked_lm_ids"][i, :k] = ex["masked_ids"]
    out["masked_lm_weights"][i, :k] = ex["weights"]
    out["next_sentence_labels"][i] = ex["label"]
  return out


def layout(exs, seq: int, max_sequences: int) -> list[list[int]]:
  """Example indices per row: in order, a new row when the next example
  does not fit or the row holds max_sequences."""
  rows, used = [[]], 0
  for i, ex in enumerate(exs):
    n = len(ex["input_ids"])
    if used + n > seq or len(rows[-1]) == max_sequences:
      rows.append([])
      used = 0
    rows[-1].append(i)
    used += n
  return rows


def packed(exs, seq: int, preds: int, max_sequences: int,
           rows: list[list[int]] | None = None) -> tuple[dict, list]:
  """The examples packed (features.PACKED_PRETRAINING); also returns, per
  example, (row, start) where it landed."""
  rows = rows or layout(exs, seq, max_sequences)
  b, s = len(rows), max_sequences
  out = dict(input_ids=np.zeros((b, seq), np.int32),
             input_mask=np.zeros((b, seq), np.int32),
             segment_ids=np.zeros((b, seq), np.int32),
             sequence_ids=np.zeros((b, seq), np.int32),
             position_ids=np.zeros((b, seq), np.int32),
             cls_positions=np.zeros((b, s), np.int32),
             masked_lm_positions=np.zeros((b, preds), np.int32),
             masked_lm_ids=np.zeros((b, preds), np.int32),
             masked_lm_weights=np.zeros((b, preds), np.float32),
             next_sentence_labels=np.zeros((b, s), np.int32),
             next_sentence_weights=np.zeros((b, s), np.float32))
  where = [None] * len(exs)
  for r, members in enumerate(rows):
    start, p = 0, 0
    for slot, i in enumerate(members):
      ex = exs[i]
      n, k = len(ex["input_ids"]), len(ex["positions"])
      span = slice(start, start + n)
      out["input_ids"][r, span] = ex["input_ids"]
      out["input_mask"][r, span] = 1
      out["segment_ids"][r, span] = ex["segment_ids"]
      out["sequence_ids"][r, span] = slot + 1
      out["position_ids"][r, span] = np.arange(n)
      out["cls_positions"][r, slot] = start
      out["next_sentence_labels"][r, slot] = ex["label"]
      out["next_sentence_weights"][r, slot] = 1.0
      out["masked_lm_positions"][r, p:p + k] = ex["positions"] + start
      out["masked_lm_ids"][r, p:p + k] = ex["masked_ids"]
      out["masked_lm_weights"][r, p:p + k] = ex["weights"]
      where[i] = (r, start)
      start, p = start + n, p + k
    assert start <= seq and p <= preds, (start, p)
  return out, where


def synthetic_batch(seed: int, batch: int, seq: int, preds: int,
                    max_sequences: int, vocab: int) -> dict:
  """A packed batch of `batch` rows: 1..max_sequences examples a row of
  random lengths (some rows end in padding), `preds` masked positions a
  row spread over its examples."""
  r = np.random.RandomState(seed)
  exs, rows = [], []
  for _ in range(batch):
    k = r.randint(1, max_sequences + 1)
    cuts = np.sort(r.choice(np.arange(5, seq - 4), k - 1, replace=False)) \
        if k > 1 else np.zeros(0, int)
    end = seq - r.randint(0, 5)
    lengths = np.diff(np.concatenate([[0], cuts, [end]]))
    lengths = [int(n) for n in lengths if n >= 5]
    per = [preds // len(lengths)] * len(lengths)
    per[0] += preds - sum(per)
    first = len(exs)
    for n, p in zip(lengths, per):
      exs.extend(examples(r.randint(1 << 30), [n], p, vocab))
    rows.append(list(range(first, len(exs))))
  out, _ = packed(exs, seq, preds, max_sequences, rows)
  return out


def assert_same_loss_and_grads(loss, grads, want_loss, want_grads) -> None:
  """A packed batch's loss and gradients (nnx.State) are the padded
  batch's: the same labelled tokens give the same sums and global counts.
  Leaves are compared in order and a failure names the param's path."""
  import jax  # pylint: disable=g-import-not-at-top  (numpy-only otherwise)
  from flax import nnx  # pylint: disable=g-import-not-at-top
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  for (path, a), (_, b) in zip(
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads)),
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(want_grads)),
      strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
