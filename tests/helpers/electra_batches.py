"""A tiny ELECTRA config and hand-masked batches (ELECTRA's model, step and
multi-device tests)."""

import numpy as np

from bert_jax import config_lib

VOCAB, SEQ, PREDS, BATCH = 128, 32, 6, 16


def tiny_electra_config(embedding_size=32, **objective):
  c = config_lib.get_config("tiny")
  c.objective.name = "electra"
  c.objective.update(objective)
  c.model.update(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=256,
                 max_position_embeddings=64, embedding_size=embedding_size,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  c.data.update(seq_length=SEQ, max_predictions_per_seq=PREDS, nsp=False)
  return c


def masked_batch(seed=0, batch=BATCH, mask_id=4):
  """Originals, then ~15% of real tokens masked ([MASK] in input_ids),
  padded prediction slots (weight 0, position 0) and padded rows."""
  r = np.random.RandomState(seed)
  lengths = r.randint(SEQ // 2, SEQ + 1, size=batch)
  mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
  original = (r.randint(5, VOCAB, (batch, SEQ)) * mask).astype(np.int32)
  original[:, 0] = 1  # [CLS]
  pos = np.zeros((batch, PREDS), np.int32)
  w = np.zeros((batch, PREDS), np.float32)
  for b in range(batch):
    n = r.randint(1, PREDS + 1)
    pos[b, :n] = np.sort(r.choice(np.arange(1, lengths[b]), n, replace=False))
    w[b, :n] = 1.0
  ids = np.take_along_axis(original, pos, 1) * (w > 0)
  inputs = original.copy()
  for b in range(batch):
    for p, wt in zip(pos[b], w[b]):
      if wt > 0:
        inputs[b, p] = mask_id
  return dict(input_ids=inputs, input_mask=mask,
              segment_ids=np.zeros_like(mask), masked_lm_positions=pos,
              masked_lm_ids=ids.astype(np.int32), masked_lm_weights=w,
              next_sentence_labels=np.zeros(batch, np.int32)), original
