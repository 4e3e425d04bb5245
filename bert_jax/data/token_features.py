"""Token-tagging features: words -> sub-tokens -> `[CLS] ... [SEP]` windows.

Each word is tokenized alone with the checkpoint's own tokenizer (as Hugging
Face's ``is_split_into_words``); a word with no piece (e.g. a lone control
character) becomes ``[UNK]``, so every word has a first sub-token. The first
sub-token carries the word's tag; the others are left out of the loss, or
with ``label_all_subtokens`` carry it too as the tag of a continuation in
the word's scheme (``B-x`` as ``I-x``, as Hugging Face's ``run_ner``; BIOES
``S-x`` / ``E-x`` words as ``I-x``... ``E-x``: :func:`continuation_tag`).
Predictions are always read at first sub-tokens.

A sentence longer than ``seq_length - 2`` sub-tokens is cut into
overlapping windows (``feature_batches.window_starts``, every ``stride``
tokens). Every word belongs to exactly one window, the one where its first
sub-token has the most context (``feature_batches.max_context_owner``): only
there is it labelled (so each word counts once in the loss) and predicted.

Gold tags outside the training tag set (possible in validation data) get no
loss (weight 0) but stay in :class:`WordMap` for the metrics, where they
count as missed entities.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from absl import logging

from bert_jax.data import feature_batches
from bert_jax.data import token_sources
from bert_jax.data import tokenizers

_CHUNK = 50_000


@dataclasses.dataclass
class WordMap:
  """Where each word is predicted: per feature its sentence and, per
  position, the word index in that sentence (-1: not a predicted word)."""
  sentence: np.ndarray  # [N] int32
  word_index: np.ndarray  # [N, T] int32


def word_pieces(tok: tokenizers.Tokenizer, words: Sequence[str]
                ) -> list[np.ndarray]:
  """Each word's piece ids (``[UNK]`` for a word with none)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = []
  for lo in range(0, len(words), _CHUNK):
    ids = tok.tokenize(tf.constant(list(words[lo:lo + _CHUNK]), tf.string))
    flat, splits = ids.flat_values.numpy(), ids.row_splits.numpy()
    out += [flat[a:b] for a, b in zip(splits[:-1], splits[1:])]
  if tok.unk_id is None and any(not len(p) for p in out):
    raise ValueError(f"Tokenizer {tok.path!r} gives no piece for a word and "
                     "has no [UNK] token to stand for it.")
  unk = np.array([tok.unk_id if tok.unk_id is not None else 0], np.int32)
  return [p.astype(np.int32) if len(p) else unk for p in out]


def continuation_tag(tag: str, label_ids: dict, last: bool) -> str:
  """The tag of a later sub-token of a word tagged `tag` (`last`: the
  word's last sub-token) under ``label_all_subtokens``, so that the
  sub-tokens read as one entity in the word's scheme: a later sub-token is
  inside the entity, never its start (``B-x`` -> ``I-x``, as Hugging Face's
  run_ner, and BIOES ``S-x`` too), and ends it only where the word does
  (BIOES ``E-x`` and ``S-x`` words: ``E-x`` on their last sub-token,
  ``I-x`` before it). ``I-x`` and ``O`` stay; a tag the tag set lacks
  falls back to the word's own."""
  prefix, dash, kind = tag.partition("-")
  if not dash or prefix not in ("B", "I", "E", "S"):
    return tag
  wanted = ("E-" if last and prefix in ("E", "S") else "I-") + kind
  return wanted if wanted in label_ids else tag


def build(data: token_sources.TaggedSentences, tok: tokenizers.Tokenizer,
          label_names: Sequence[str], *, seq_length: int, stride: int,
          label_all_subtokens: bool = False
          ) -> tuple[feature_batches.Features, WordMap]:
  """Features of every sentence (labels, label_weights) and its WordMap."""
  if tok.cls_id is None or tok.sep_id is None:
    raise ValueError(f"Tokenizer {tok.path!r} has no [CLS] or [SEP] token; "
                     "token tagging needs both.")
  window = seq_length - 2
  if window < 1:
    raise ValueError(f"data.seq_length={seq_length} leaves no room for a "
                     "token next to [CLS] and [SEP].")
  if not 1 <= stride <= window:
    raise ValueError(f"task.doc_stride={stride} must be between 1 and the "
                     f"window's {window} tokens (data.seq_length - 2).")
  label_ids = {t: i for i, t in enumerate(label_names)}
  flat = [w for ws in data.words for w in ws]
  pieces = word_pieces(tok, flat)
  rows_ids, rows_labels, rows_weights, rows_words, sentences = (
      [], [], [], [], [])
  unknown, k = 0, 0
  for s, (words, tags) in enumerate(zip(data.words, data.tags)):
    per_word = pieces[k:k + len(words)]
    k += len(words)
    ids = np.concatenate(per_word)
    word_of = np.repeat(np.arange(len(words)), [len(p) for p in per_word])
    first = np.zeros(len(ids), bool)
    first[np.cumsum([0] + [len(p) for p in per_word[:-1]])] = True
    tag_ids = np.array([label_ids.get(t, -1) for t in tags], np.int64)
    unknown += int(np.sum(tag_ids < 0))
    piece_labels = tag_ids[word_of]
    if label_all_subtokens:
      last = np.zeros(len(ids), bool)
      last[np.cumsum([len(p) for p in per_word]) - 1] = True
      inner, final = (np.array([label_ids.get(continuation_tag(
          t, label_ids, at_end), -1) for t in tags], np.int64)
                      for at_end in (False, True))
      piece_labels = np.where(first, piece_labels,
                              np.where(last, final[word_of], inner[word_of]))
    starts = feature_batches.window_starts(len(ids), window, stride)
    lens = [min(window, len(ids) - st) for st in starts]
    owner = np.array([feature_batches.max_context_owner(p, starts, lens)
                      for p in np.flatnonzero(first)])
    owner_of_piece = owner[word_of]
    for w, (st, n) in enumerate(zip(starts, lens)):
      sl = slice(st, st + n)
      owned = owner_of_piece[sl] == w
      labelled = owned & (first[sl] | label_all_subtokens) & (
          piece_labels[sl] >= 0)
      rows_ids.append(np.concatenate([[tok.cls_id], ids[sl], [tok.sep_id]]))
      rows_labels.append(np.concatenate([[0], np.maximum(piece_labels[sl], 0),
                                         [0]]))
      rows_weights.append(np.concatenate([[0.], labelled.astype(float), [0.]]))
      rows_words.append(np.concatenate(
          [[-1], np.where(owned & first[sl], word_of[sl], -1), [-1]]))
      sentences.append(s)
  if unknown:
    logging.warning("%d words have tags outside the training tag set %s: "
                    "they get no loss and count as missed entities.",
                    unknown, list(label_names))
  pad = lambda rows, dtype, fill: np.stack([
      np.pad(r, (0, seq_length - len(r)), constant_values=fill)
      for r in rows]).astype(dtype)
  features = feature_batches.Features(
      input_ids=pad(rows_ids, np.int32, 0),
      lengths=np.array([len(r) for r in rows_ids], np.int32),
      arrays=dict(labels=pad(rows_labels, np.int32, 0),
                  label_weights=pad(rows_weights, np.float32, 0)))
  return features, WordMap(np.array(sentences, np.int32),
                           pad(rows_words, np.int32, -1))


def word_predictions(word_map: WordMap, feature_index: np.ndarray,
                     position_labels: np.ndarray,
                     sentence_lengths: Sequence[int]) -> list[np.ndarray]:
  """Per sentence, the predicted label id of each word (-1: none).

  `feature_index` [M] names the feature of each row of `position_labels`
  [M, T'] (argmax per position; T' may be shorter than seq_length: a
  bucket); rows with index -1 are padding.
  """
  out = [np.full(n, -1, np.int64) for n in sentence_lengths]
  for f, labels in zip(feature_index, position_labels):
    if f < 0:
      continue
    words = word_map.word_index[f, :labels.shape[0]]
    at = words >= 0
    out[int(word_map.sentence[f])][words[at]] = labels[at]
  return out
