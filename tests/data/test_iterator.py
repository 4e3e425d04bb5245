"""data/iterator.py on a toy tf.data pipeline: a saved state continues the
stream exactly, a state of other batch shapes carries the data position
over as examples consumed, and a pipeline of varying batch sizes refuses
that carry-over with one sentence."""

import pytest
import tensorflow as tf

from bert_jax.data import examples
from bert_jax.data import iterator


def _pipeline(batch_size: int, rows: int = 96, seed: int = 3,
              drop_remainder: bool = True):
  """Rows 0..rows-1 shuffled by a fixed seed, batched (without
  drop_remainder the batch size is not static); each batch also carries the
  per-block counters the real pipeline adds."""
  ds = tf.data.Dataset.range(rows).shuffle(rows, seed=seed,
                                           reshuffle_each_iteration=False)
  ds = ds.map(lambda i: dict(input_ids=tf.fill([4], tf.cast(i, tf.int32))))
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  stats = tf.constant([1] * len(examples.STATS), tf.int64)
  return ds.map(lambda b: dict(b, **{examples.STATS_KEY: stats}))


def _rows(batch) -> list[int]:
  return batch["input_ids"][:, 0].tolist()


def test_restored_state_continues_where_the_saved_one_stopped(tmp_path):
  straight = iterator.DataIterator(_pipeline(8))
  expected = [_rows(next(straight)) for _ in range(6)]

  first = iterator.DataIterator(_pipeline(8))
  assert [_rows(next(first)) for _ in range(2)] == expected[:2]
  first.save(str(tmp_path))
  assert first.examples_consumed == 16
  assert set(first.stats.values()) == {2}  # Counters summed, not batched.

  resumed = iterator.DataIterator(_pipeline(8))
  resumed.restore(str(tmp_path))
  assert resumed.examples_consumed == 16 and set(resumed.stats.values()) == {2}
  assert [_rows(next(resumed)) for _ in range(4)] == expected[2:]
  assert examples.STATS_KEY not in next(resumed)  # Not what training sees.


def test_other_batch_size_continues_after_the_examples_consumed(tmp_path,
                                                                caplog):
  first = iterator.DataIterator(_pipeline(8))
  seen = [r for _ in range(3) for r in _rows(next(first))]  # 24 examples.
  first.save(str(tmp_path))

  bigger = iterator.DataIterator(_pipeline(16))
  with caplog.at_level("WARNING"):
    bigger.restore(str(tmp_path))
  assert "Data shapes changed since the checkpoint ([8, 4] -> [16, 4])" \
      in caplog.text
  # ceil(24 / 16) = 2 batches of the new pipeline are skipped.
  order = [r for b in iterator.DataIterator(_pipeline(16)) for r in _rows(b)]
  assert order[:24] == seen
  assert _rows(next(bigger)) == order[32:48]
  assert bigger.examples_consumed == 48

  # The skip is part of the saved state: the skipped pipeline resumes too.
  bigger.save(str(tmp_path / "again"))
  again = iterator.DataIterator(_pipeline(16))
  again.restore(str(tmp_path / "again"))
  assert _rows(next(again)) == order[48:64]


def test_varying_batch_sizes_cannot_carry_a_position_over(tmp_path):
  first = iterator.DataIterator(_pipeline(8))
  next(first)
  first.save(str(tmp_path))
  it = iterator.DataIterator(_pipeline(8, drop_remainder=False))
  assert it.batch_size() is None
  with pytest.raises(ValueError) as e:
    it.restore(str(tmp_path))
  assert str(e.value) == (
      "The saved data position cannot be carried over to batches of other "
      "shapes ([8, 4] -> [None, 4]); resume with the checkpoint's batch_size "
      "and seq_length.")
  with pytest.raises(ValueError, match=f"No data iterator state at "
                     f"{tmp_path / 'none'}"):
    it.restore(str(tmp_path / "none"))


def test_bad_lines_over_one_percent_are_warned_about_once(caplog):
  counts = {k: 0 for k in examples.STATS}
  counts.update(lines=100, invalid_utf8_lines=2)
  stats = tf.constant([counts[k] for k in examples.STATS], tf.int64)
  ds = tf.data.Dataset.from_tensors(dict(
      input_ids=tf.zeros([2, 4], tf.int32),
      **{examples.STATS_KEY: stats})).repeat(12)
  it = iterator.DataIterator(ds)
  it.sources = "corpus/*.txt"
  with caplog.at_level("WARNING"):
    for _ in it:
      pass
  warnings = [r.getMessage() for r in caplog.records
              if r.levelname == "WARNING"]
  assert warnings == [
      "Data (process 0): of 100 lines read from corpus/*.txt, 2 (2.0%) "
      "invalid_utf8; those lines are trained on repaired (U+FFFD), cut to "
      "data.max_line_bytes or skipped. Check the files are UTF-8 text, one "
      "sentence per line."]
  assert it.stats["lines"] == 1200
