"""The data of a pretraining run: tokenizer, train iterator, eval batches.

Fine-tuning brings its own data object with the same attributes
(`train_iter`, `eval_batches`, `eval_extras()`); the trainer reads only
those, plus `train_iterator(config)` to start another phase's pipeline.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import pretrained
from bert_jax.data import tokenizers
from bert_jax.training import config_checks


def unigram_baseline(batches, vocab_size: int) -> float:
  """Held-out MLM accuracy of always predicting the most frequent target.

  The most frequent token is taken from the held-out targets themselves, so
  this is the best any context-free constant predictor can score. Counted
  over every process's eval rows, like the eval metrics it is shown next to.
  """
  counts = np.zeros(vocab_size, np.float64)
  for b in batches:
    np.add.at(counts, np.asarray(b["masked_lm_ids"]).ravel(),
              np.asarray(b["masked_lm_weights"], np.float64).ravel())
  if jax.process_count() > 1:
    counts = np.asarray(multihost_utils.process_allgather(
        counts.astype(np.float32))).reshape(-1, vocab_size).sum(0)
  total = counts.sum()
  return float(counts.max() / total) if total else 0.0


class PretrainingInput:
  """The pretraining data of a run: its tokenizer (trained and cached when
  none is given), the checkpointable train iterator and fixed eval batches.

  `train_config` gives the train iterator's shapes when they differ from
  `config`'s (a run's phase), `train_rows` its rows per batch on this host
  when they differ from its batch size (a batch-size warm-up's common
  divisor); `train_iterator` builds another phase's.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               train_config: ml_collections.ConfigDict | None = None,
               train_rows: int | None = None):
    # TensorFlow: imported only when training.
    from bert_jax.data import pipeline, sources  # pylint: disable=g-import-not-at-top
    self.workdir = workdir
    self.tokenizer = tokenizers.load_tokenizer(config.data, workdir)
    config_checks.check_tokenizer(config, self.tokenizer)
    # JSONL / Parquet records become text files (a tokenizer trained here
    # read them already) before the tokenizer is recorded: a bad record is
    # refused naming its file and line, and leaves no file.
    sources.prepare_records(config.data, workdir)
    pretrained.record_tokenizer(workdir, self.tokenizer)
    self.train_iter = self.train_iterator(train_config or config, train_rows)
    self.eval_batches = pipeline.create_eval_batches(
        config, self.tokenizer, self.workdir, **self._process())
    self.unigram_accuracy = unigram_baseline(self.eval_batches,
                                             config.model.vocab_size)

  @staticmethod
  def _process() -> dict:
    return dict(process_index=jax.process_index(),
                process_count=jax.process_count())

  def train_iterator(self, config: ml_collections.ConfigDict,
                     rows: int | None = None):
    """A fresh train iterator with `config`'s shapes and seed (`rows` per
    batch on this host; None: its batch size)."""
    from bert_jax.data import pipeline  # pylint: disable=g-import-not-at-top
    return pipeline.create_train_iterator(
        config, self.tokenizer, self.workdir, batch_size=rows,
        **self._process())

  def eval_extras(self) -> dict:
    """Reference numbers logged beside every eval."""
    return {"unigram_accuracy": self.unigram_accuracy}
