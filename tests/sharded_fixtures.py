"""A tiny deterministic model config and batches for the multi-device tests.

Imported by tests/test_sharding.py and tests/test_multiprocess.py and by the
child processes they start (which run those files as scripts, with the repo
on PYTHONPATH), so it imports nothing from pytest.
"""

from __future__ import annotations

import ml_collections
import numpy as np

BATCH = 16
SEQ = 32
PREDS = 5
VOCAB = 256


def tiny_config(data=1, fsdp=1, tensor=1, accum=1,
                num_steps=10) -> ml_collections.ConfigDict:
  """2 layers x 64, dropout off (runs on different meshes must agree)."""
  from bert_jax import config_lib
  c = config_lib.get_config("tiny")
  c.model.update(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=256,
                 max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
  c.data.seq_length = SEQ
  c.data.max_predictions_per_seq = PREDS
  c.train.update(batch_size=BATCH, num_steps=num_steps, warmup_steps=1,
                 learning_rate=1e-3, grad_accum_steps=accum)
  c.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
  return c


def synthetic_batch(step: int, seed: int = 1000, batch=BATCH, seq=SEQ,
                    preds=PREDS, vocab=VOCAB) -> dict:
  """A deterministic global batch with padding and varying masked weights."""
  r = np.random.RandomState(seed + step)
  lengths = r.randint(seq // 2, seq + 1, size=batch)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  return dict(
      input_ids=(r.randint(5, vocab, (batch, seq)) * mask).astype(np.int32),
      input_mask=mask,
      segment_ids=((np.arange(seq)[None] >= lengths[:, None] // 2) * mask
                   ).astype(np.int32),
      masked_lm_positions=r.randint(1, seq // 2, (batch, preds)).astype(
          np.int32),
      masked_lm_ids=r.randint(5, vocab, (batch, preds)).astype(np.int32),
      masked_lm_weights=(r.rand(batch, preds) > 0.3).astype(np.float32),
      next_sentence_labels=r.randint(0, 2, (batch,)).astype(np.int32))
