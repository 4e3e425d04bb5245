"""A SentencePiece tokenizer and ~130k tokens of [CLS] .. [SEP] [PAD] rows,
and how to mask them: the masking statistics tests (BERT's and ALBERT's)."""

import numpy as np
import tensorflow as tf

from bert_jax.data import demo_corpus
from bert_jax.data import masking
from bert_jax.data import tokenizers

T, P = 64, 12


def corpus(d):
  """SentencePiece tokenizer + rows [CLS] tokens.. [SEP] [PAD].. (~130k tokens)."""
  docs = demo_corpus.synthetic_documents(1500, seed=5)
  sents = [s for doc in docs for s in doc]
  tok = tokenizers.train(tokenizers.SENTENCEPIECE, iter(sents), 300, True,
                         str(d / "spm.model"))
  flat = np.concatenate([tok.encode(s) for s in sents])
  rng = np.random.default_rng(0)
  rows, i = [], 0
  while i < len(flat) - T:
    n = int(rng.integers(T // 4, T - 1))  # real tokens incl. [CLS]/[SEP]
    body = flat[i:i + n - 2]
    i += n - 2
    row = np.full(T, tok.pad_id, np.int32)
    row[0], row[1:n - 1], row[n - 1] = tok.cls_id, body, tok.sep_id
    rows.append(row)
  return tok, np.stack(rows)


def run(masker, ids, seed=0, bsz=256):
  outs = []
  for k in range(0, len(ids), bsz):
    o = masker(tf.constant(ids[k:k + bsz]), tf.constant([seed, k], tf.int64))
    outs.append({n: v.numpy() for n, v in o.items()})
  return {n: np.concatenate([o[n] for o in outs]) for n in outs[0]}


def make(tok, **kw):
  return masking.Masker(vocab_size=tok.vocab_size, special_ids=tok.special_ids,
                        mask_id=tok.mask_id, max_predictions=P,
                        word_start=tok.word_start, **kw)


def outcomes(ids, out, tok):
  """Per selected position: 0 = [MASK], 1 = random, 2 = kept."""
  w = out["masked_lm_weights"] > 0
  rows = np.nonzero(w)[0]
  pos = out["masked_lm_positions"][w]
  new = out["input_ids"][rows, pos]
  orig = ids[rows, pos]
  assert (out["masked_lm_ids"][w] == orig).all()
  return np.where(new == tok.mask_id, 0, np.where(new == orig, 2, 1)), rows, pos
