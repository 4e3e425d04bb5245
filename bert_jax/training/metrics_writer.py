"""Where a run's numbers go: absl lines' helpers, metrics.jsonl, TensorBoard.

One JSON object per logged step in WORKDIR/metrics.jsonl (appended through
tf.io.gfile, so local and gs:// workdirs work) and TensorBoard event files
under WORKDIR/tensorboard/{train,eval} written with tf.summary: TensorFlow is
already loaded for the input pipeline, and the writers go wherever tf.io.gfile
goes. (tensorboardX would import PyTorch wherever it is installed, a few
seconds at every start of a job.)
"""

from __future__ import annotations

import json
import os

from absl import logging


class MetricsWriter:
  """One JSON object per logged step in metrics.jsonl, plus TensorBoard.

  The workdir may be any tf.io.gfile path (local or gs://): metrics.jsonl
  is appended through tf.io.gfile, and so are the TensorBoard events
  (tf.summary's writers); where a writer cannot be made they are skipped
  with a warning.
  """

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._tb = {}
    if not enabled:
      return
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._jsonl = tf.io.gfile.GFile(os.path.join(workdir, "metrics.jsonl"),
                                    "a")
    self._tb = _tensorboard_writers(workdir)
    self._scalar = _scalar_metadata() if self._tb else b""

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: float(v) for k, v in metrics.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if split in self._tb:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      with self._tb[split].as_default(step=int(step)):
        for k, v in metrics.items():
          tf.summary.write(k, tf.constant(float(v), tf.float32),
                           metadata=self._scalar)
      self._tb[split].flush()

  def close(self):
    if self.enabled:
      self._jsonl.close()
      for tb in self._tb.values():
        tb.close()


def _scalar_metadata() -> bytes:
  """What marks a summary as a scalar for TensorBoard's scalars dashboard.
  (tf.summary.scalar writes the same but lives in the tensorboard package,
  which TensorFlow no longer installs.)"""
  from tensorflow.core.framework import summary_pb2  # pylint: disable=g-import-not-at-top
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(
          plugin_name="scalars")).SerializeToString()


def _tensorboard_writers(workdir: str) -> dict:
  """{split: tf.summary writer}, or {} where it cannot write."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    return {split: tf.summary.create_file_writer(
        os.path.join(workdir, "tensorboard", split))
            for split in ("train", "eval")}
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("TensorBoard events are not written to %s (%s); "
                    "metrics.jsonl is.", workdir, e)
    return {}


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
