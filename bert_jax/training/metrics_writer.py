"""Where a run's numbers go: absl lines' helpers, metrics.jsonl, TensorBoard.

One JSON object per logged step in WORKDIR/metrics.jsonl (appended through
tf.io.gfile, so local and gs:// workdirs work) and TensorBoard event files
under WORKDIR/tensorboard/{train,eval} written with tensorboardX.
"""

from __future__ import annotations

import json
import os

import tensorboardX
from absl import logging


class MetricsWriter:
  """One JSON object per logged step in metrics.jsonl, plus TensorBoard.

  The workdir may be any tf.io.gfile path (local or gs://): metrics.jsonl
  is appended through tf.io.gfile. TensorBoard events go through
  tensorboardX, which writes local paths and gs:// (with the
  google-cloud-storage package); elsewhere they are skipped with a warning.
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

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: float(v) for k, v in metrics.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if split in self._tb:
      for k, v in metrics.items():
        self._tb[split].add_scalar(k, float(v), int(step))
      self._tb[split].flush()

  def close(self):
    if self.enabled:
      self._jsonl.close()
      for tb in self._tb.values():
        tb.close()


def _tensorboard_writers(workdir: str) -> dict:
  """{split: tensorboardX.SummaryWriter}, or {} where it cannot write."""
  scheme = workdir.split("://")[0] if "://" in workdir else ""
  if scheme not in ("", "gs", "s3"):
    logging.warning("TensorBoard events are not written to %s:// workdirs "
                    "(metrics.jsonl is).", scheme)
    return {}
  try:
    return {split: tensorboardX.SummaryWriter(
        os.path.join(workdir, "tensorboard", split))
            for split in ("train", "eval")}
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("TensorBoard events are not written (%s); for gs:// "
                    "install google-cloud-storage. metrics.jsonl is.", e)
    return {}


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
