"""End-to-end training: the loss falls, runs resume, bad configs fail clearly."""

import json
import os

import jax
import numpy as np
import pytest

from bert_jax.training import config_checks
from bert_jax.training import metrics_writer
from bert_jax.training import pretraining_input
from bert_jax.training import trainer as trainer_lib
from tests.helpers import in_process
from tests.helpers import tiny_config


def read_metrics(workdir, split="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if r["split"] == split]


def tensorboard_scalars(directory) -> dict:
  """{(step, tag): value} of the scalar summaries in `directory`'s event
  files, as TensorBoard's scalars dashboard reads them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for path in directory.iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        assert value.metadata.plugin_data.plugin_name == "scalars", value.tag
        out[(event.step, value.tag)] = tf.make_ndarray(value.tensor)
  return out


@pytest.mark.slow
def test_loss_falls_and_metrics_are_logged(tmp_path):
  config = tiny_config()
  config.train.num_steps = 40
  config.train.log_every = 1
  config.train.eval_every = 40
  config.checkpoint.save_every_steps = 40
  final = trainer_lib.train_and_evaluate(config, str(tmp_path))
  rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == list(range(1, 41))
  required = {"step", "split", "loss", "mlm_loss", "mlm_accuracy",
              "nsp_accuracy", "learning_rate", "tokens_per_sec"}
  assert required <= set(rows[0])
  first = np.mean([r["loss"] for r in rows[:5]])
  last = np.mean([r["loss"] for r in rows[-5:]])
  assert last < first - 1.0, (first, last)
  evals = read_metrics(tmp_path, "eval")
  assert evals[-1]["step"] == 40 and 0 <= evals[-1]["mlm_accuracy"] <= 1
  assert final["eval_mlm_accuracy"] == evals[-1]["mlm_accuracy"]
  # TensorBoard's scalars: every logged number at its step, as in the JSONL.
  for split, logged in (("train", rows), ("eval", evals)):
    events = tensorboard_scalars(tmp_path / "tensorboard" / split)
    assert events == {(r["step"], k): np.float32(v) for r in logged
                      for k, v in r.items() if k not in ("step", "split")}


@pytest.mark.slow
def test_rerun_resumes_from_latest_checkpoint(tmp_path):
  common = ("--config.train.log_every=1", "--config.train.eval_every=100",
            "--config.checkpoint.save_every_steps=3")
  first = in_process.run_main(tmp_path, "--config.train.num_steps=6", *common)
  assert first.returncode == 0, first.stderr[-3000:]
  second = in_process.run_main(tmp_path, "--config.train.num_steps=9", *common)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "Resumed from checkpoint step 6" in second.stderr
  steps = [r["step"] for r in read_metrics(tmp_path)]
  assert steps == list(range(1, 10))  # 7..9 continue; nothing repeated.
  assert "9" in os.listdir(os.path.join(tmp_path, "checkpoints"))


@pytest.mark.parametrize("flag,message", [
    ("--config.model.num_attention_heads=3",
     "model.hidden_size=64 is not divisible by model.num_attention_heads=3"),
    ("--config.data.seq_length=128",
     "data.seq_length=128 exceeds model.max_position_embeddings=64"),
    ("--config.data.train_files=/nonexistent/dir/*.txt", "/nonexistent/dir"),
])
def test_bad_input_fails_with_one_clear_line_and_leaves_workdir(
    tmp_path, flag, message):
  marker = tmp_path / "keep.txt"
  marker.write_text("user data")
  result = in_process.run_main(tmp_path, flag, "--config.train.num_steps=2")
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
  assert marker.read_text() == "user data"


def test_batch_not_divisible_by_data_parallel_size_names_both():
  config = tiny_config()
  config.train.batch_size = 12
  with pytest.raises(ValueError, match=r"train.batch_size=12 .*mesh.data\*"
                     r"mesh.fsdp=8"):
    config_checks.validate(config, num_devices=8)


@pytest.mark.slow
def test_loop_reads_device_only_at_log_steps_and_compiles_once(
    tmp_path, monkeypatch):
  """Between log/eval/save steps the loop only enqueues work: no device->host
  read (which would stall the device queue) and no recompilation, on real
  pipeline batches with varied masks and lengths."""
  config = tiny_config()
  config.train.num_steps = 12
  config.train.log_every = 6
  config.train.eval_every = 12
  config.checkpoint.save_every_steps = 12
  os.makedirs(tmp_path, exist_ok=True)
  trainer = trainer_lib.Trainer(config, str(tmp_path))
  events = []
  step_fn = trainer.train_step

  def counted_step(state, batch):
    events.append("step")
    return step_fn(state, batch)

  real_get = jax.device_get

  def counted_get(x):
    events.append("get")
    return real_get(x)

  def listener(event, *args, **kwargs):
    if event == "/jax/compilation_cache/compile_requests_use_cache":
      events.append("compile")

  trainer.train_step = counted_step
  monkeypatch.setattr(jax, "device_get", counted_get)
  jax.monitoring.register_event_listener(listener)
  try:
    trainer.run()
  finally:
    jax.monitoring.unregister_event_listener(listener)
    trainer.shutdown()
  # What happened after each train step, until the next one.
  after, step = {}, 0
  for e in events:
    if e == "step":
      step += 1
      after[step] = []
    elif step:
      after[step].append(e)
  assert step == 12
  quiet = [s for s in range(1, 13) if s not in (6, 12)]
  assert all(after[s] == [] for s in quiet), after
  assert "get" in after[6]  # The log step does read (metrics, flags).
  assert "compile" not in after[6] and "compile" not in after[1]


def test_unigram_baseline_is_the_most_frequent_targets_share():
  batches = [dict(masked_lm_ids=np.array([[7, 7, 3], [3, 7, 0]]),
                  masked_lm_weights=np.array([[1., 1., 1.], [1., 1., 0.]])),
             dict(masked_lm_ids=np.array([[3, 3, 0]]),
                  masked_lm_weights=np.array([[1., 1., 0.]]))]
  # Targets (weight > 0): 7 x3, 3 x4 -> 4/7; the padded slots do not count.
  assert pretraining_input.unigram_baseline(batches, 16) == pytest.approx(4 / 7)
  assert pretraining_input.unigram_baseline([], 16) == 0.0


def test_metrics_writer_appends_through_gfile_urls(tmp_path, monkeypatch):
  """A URL workdir (ram:// here, gs:// on Cloud TPU) gets metrics.jsonl via
  tf.io.gfile, appended across restarts, and nothing written locally."""
  import tensorflow as tf
  monkeypatch.chdir(tmp_path)  # A URL treated as a local path would land here.
  workdir = "ram://bert_jax_test/run"
  tf.io.gfile.makedirs(workdir)
  first = metrics_writer.MetricsWriter(workdir, enabled=True)
  first.write(1, "train", {"loss": 2.5})
  first.write(2, "train", {"loss": 2.25})
  first.close()
  resumed = metrics_writer.MetricsWriter(workdir, enabled=True)
  resumed.write(3, "eval", {"mlm_accuracy": 0.5})
  resumed.close()
  with tf.io.gfile.GFile(workdir + "/metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [(r["step"], r["split"]) for r in rows] == [
      (1, "train"), (2, "train"), (3, "eval")]
  assert rows[1]["loss"] == 2.25
  assert os.listdir(tmp_path) == []
