"""Fine-tuning on packed rows (data.packing): every validation example is
predicted exactly once, with its own tokens and label; training on packed
rows reaches the validation accuracy of length buckets on the keyword task
(tests/helpers/tiny_models.py) over 3 seeds; packed evaluation writes the
predictions of buckets.
"""

import json

import numpy as np
import pytest

from bert_jax.data import packing
from bert_jax.data import task_data
from bert_jax.data import task_sources
from bert_jax.data import tokenizers
from bert_jax.downstream import finetuning
from tests.helpers import tiny_models

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  return tiny_models.make_hf_dir(str(tmp_path_factory.mktemp("ft_pack")))


def _rows(n, seed):
  text, labels = zip(*tiny_models.keyword_rows(n, seed))
  return task_sources.Rows(
      text_a=np.asarray(text, object), text_b=None,
      labels=np.asarray([l == "pos" for l in labels], np.int32),
      index=np.arange(n))


def test_packed_eval_predicts_every_example_once(tiny_hf):
  tok = tokenizers.load(tiny_hf["vocab_path"], tokenizers.WORDPIECE, True)
  rows = _rows(203, 5)
  options = packing.PackingOptions(max_sequences=6, window=64)
  kw = dict(seq_length=32, batch_size=8)
  padded = task_data.eval_batches(rows, tok, buckets=(32,), **kw)
  alone = {}
  for b in padded:
    for i, idx in enumerate(b[task_data.INDEX]):
      if idx >= 0:
        n = b["input_mask"][i].sum()
        alone[int(idx)] = tuple(b["input_ids"][i, :n])
  packed = task_data.eval_batches(rows, tok, packing=options, **kw)
  seen = []
  for b in packed:
    assert b["input_ids"].shape == (8, 32) and b["labels"].shape == (8, 6)
    w = b["example_weights"] > 0
    assert (b[task_data.INDEX][~w] == -1).all()
    for r, s in zip(*np.nonzero(w)):
      idx = int(b[task_data.INDEX][r, s])
      at = b["sequence_ids"][r] == s + 1
      assert tuple(b["input_ids"][r, at]) == alone[idx]
      assert b["cls_positions"][r, s] == np.argmax(at)
      assert b["labels"][r, s] == rows.labels[idx]
      seen.append(idx)
  assert sorted(seen) == list(range(len(rows)))
  assert len(packed) < len(padded) / 2  # ~4 examples a 32-slot row.


@pytest.mark.slow
def test_packed_finetuning_matches_buckets_over_three_seeds(tiny_hf,
                                                           tmp_path,
                                                           optimized):
  train, dev = tiny_models.write_keyword_task(str(tmp_path), n_train=512,
                                              n_dev=200)
  scores = {}
  for packed in (False, True):
    for seed in SEEDS:
      config = tiny_models.finetune_config(tiny_hf["out"], train, dev)
      # 4 epochs (3 leave some bucketed seeds short of learning it); ~4
      # keyword sentences fill a 32-slot row, so 4 packed rows a step train
      # on about the 16 examples of a bucketed step.
      config.train.update(num_steps=0, num_epochs=4.0, seed=seed,
                          batch_size=4 if packed else 16, log_every=1000)
      config.task.buckets = (32,)  # One compile a side.
      config.data.update(packing=packed, packing_max_sequences=8,
                         packing_window=128)
      results = finetuning.run(config, str(tmp_path / f"{packed}-{seed}"))
      assert results["eval_examples"] == {"validation": 200}
      scores[packed, seed] = results["scores"]["validation"]["accuracy"]
  buckets = np.array([scores[False, s] for s in SEEDS])
  packed = np.array([scores[True, s] for s in SEEDS])
  assert buckets.min() >= 0.9, scores  # Learned (chance is 0.5).
  # Within seed noise: the packed mean within the buckets' spread (+ 2%).
  assert abs(packed.mean() - buckets.mean()) <= max(
      2 * buckets.std(), 0.02), scores


@pytest.mark.slow
def test_packed_evaluation_writes_the_predictions_of_buckets(tiny_hf,
                                                            tmp_path):
  """The same params (learning rate 0: the checkpoint's encoder, the
  seed's head) evaluated on packed rows and on length buckets: the same
  records in predictions.jsonl (probabilities within float32 rounding)
  and the same scores."""
  train, dev = tiny_models.write_keyword_task(str(tmp_path), n_train=64,
                                              n_dev=200)
  records = {}
  for packed in (False, True):
    config = tiny_models.finetune_config(tiny_hf["out"], train, dev,
                                         num_steps=2, learning_rate=0.0)
    config.train.update(warmup_steps=0, batch_size=4 if packed else 16)
    config.task.buckets = (16, 32)
    config.data.update(packing=packed, packing_max_sequences=8,
                       packing_window=128)
    workdir = tmp_path / f"lr0_{packed}"
    results = finetuning.run(config, str(workdir))
    with open(workdir / "predictions" / "validation" /
              "predictions.jsonl") as f:
      records[packed] = (results["scores"], [json.loads(l) for l in f])
  (scores, buckets), (packed_scores, packed) = records[False], records[True]
  assert len(packed) == len(buckets) == 200
  for a, b in zip(packed, buckets):
    pa, pb = a.pop("probabilities"), b.pop("probabilities")
    assert a == b
    assert pa.keys() == pb.keys()
    np.testing.assert_allclose(list(pa.values()), list(pb.values()),
                               atol=1e-6)
  assert packed_scores == scores
