"""Which input checks apply is the job's (bert_jax/data/checks.py): every
pretraining objective checks the pretraining pipeline's fields, a fine-tuning
task only the sequence shape and its head; messages name the field."""

import pytest

from bert_jax.training import config_checks
from tests import helpers


def _config(objective: str):
  """A tiny config that passes every check for `objective`."""
  config = helpers.tiny_config()
  config.objective.name = objective
  if objective == "albert":
    config.model.embedding_size = 32
    config.data.update(objective="sop", max_ngram=3)
  elif objective == "distil":
    config.objective.update(teacher="random", student_layers=1)
    config.data.update(objective="packed", nsp=False)
  elif objective == "electra":
    config.model.embedding_size = 32
    # ELECTRA trains no pair head: packed input (check_packed_input).
    config.data.update(objective="packed", nsp=False)
  return config


def _validate(config):
  return config_checks.validate(config, num_devices=1, check_sources=False)


# A pretraining-only field set wrong, and what pretraining says about it.
PIPELINE_ONLY = [
    (dict(model=dict(type_vocab_size=0)),
     "data.objective='nsp' needs model.type_vocab_size >= 2, got 0."),
    (dict(data=dict(max_predictions_per_seq=40)),
     r"data.max_predictions_per_seq=40 must be in \[1, data.seq_length=32\]."),
    (dict(data=dict(mask_rate=0.0)), r"data.mask_rate=0.0 must be in \(0, 1\]."),
    (dict(data=dict(tokenizer_vocab_size=8)),
     r"data.tokenizer_vocab_size=8 is too small \(need >= 16\)."),
    (dict(data=dict(block_lines=1)), "data.block_lines=1 must be >= 2."),
]


def _with(config, change):
  for group, fields in change.items():
    config[group].update(fields)
  return config


@pytest.mark.parametrize("objective", ["bert", "electra", "albert", "distil"])
@pytest.mark.parametrize("change, message", PIPELINE_ONLY[1:])
def test_every_pretraining_objective_checks_its_pipeline(objective, change,
                                                         message):
  _validate(_config(objective))
  with pytest.raises(ValueError, match=message):
    _validate(_with(_config(objective), change))


@pytest.mark.parametrize("change, message", PIPELINE_ONLY)
def test_classify_skips_the_pretraining_pipelines_checks(change, message):
  with pytest.raises(ValueError, match=message):
    _validate(_with(_config("bert"), change))
  _validate(_with(_config("classify"), change))  # Passes.


@pytest.mark.parametrize("objective", ["bert", "classify"])
@pytest.mark.parametrize("change, message", [
    (dict(data=dict(seq_length=128)),
     "data.seq_length=128 exceeds model.max_position_embeddings=64."),
    (dict(data=dict(seq_length=4)),
     r"data.seq_length=4 is too short \(need >= 8\)."),
    (dict(model=dict(attention_impl="splash")),
     "model.attention_impl='splash' needs a sequence length that is a "
     "multiple of 128, got 32"),
])
def test_every_job_checks_the_sequence_shape(objective, change, message):
  with pytest.raises(ValueError, match=message):
    _validate(_with(_config(objective), change))


def test_classify_checks_its_head():
  with pytest.raises(ValueError, match=r"model.num_labels=0 must be >= 1 "
                     r"\(1: regression\)."):
    _validate(_with(_config("classify"), dict(model=dict(num_labels=0))))


def _task(objective: str):
  """A tiny config with configs/finetune.py's task group for `objective`
  (questions of at most 8 tokens fit data.seq_length 32)."""
  config = _config(objective)
  config.task = helpers.load_config("finetune").task
  config.task.max_query_length = 8
  return config


@pytest.mark.parametrize("objective", ["token_classify", "span_qa"])
@pytest.mark.parametrize("change, message", PIPELINE_ONLY)
def test_task_objectives_skip_the_pretraining_pipelines_checks(
    objective, change, message):
  del message
  _validate(_task(objective))
  _validate(_with(_task(objective), change))


@pytest.mark.parametrize("objective", ["token_classify", "span_qa"])
def test_task_objectives_check_the_sequence_shape(objective):
  with pytest.raises(ValueError, match="data.seq_length=128 exceeds "
                     "model.max_position_embeddings=64."):
    _validate(_with(_task(objective), dict(data=dict(seq_length=128))))


@pytest.mark.parametrize("objective, change, message", [
    ("token_classify", dict(model=dict(num_labels=0)),
     r"model.num_labels=0 must be >= 1 \(the tag set's size\)."),
    ("token_classify", dict(task=dict(doc_stride=31)),
     r"task.doc_stride=31 must be between 1 and the window's 30 tokens "
     r"\(data.seq_length - 2\), or 0 \(half the window\)."),
    ("token_classify", dict(task=dict(doc_stride=-1)), "task.doc_stride=-1"),
    ("span_qa", dict(task=dict(max_query_length=29)),
     r"data.seq_length=32 must exceed task.max_query_length=29 \+ 3 "
     r"\(\[CLS\] and two \[SEP\]\) to leave room for the context."),
    ("span_qa", dict(task=dict(max_query_length=0)),
     "task.max_query_length=0 must be >= 1."),
    ("span_qa", dict(task=dict(n_best_size=0)),
     "task.n_best_size=0 must be >= 1."),
    ("span_qa", dict(task=dict(max_answer_length=0)),
     "task.max_answer_length=0 must be >= 1."),
    ("span_qa", dict(task=dict(doc_stride=-2)),
     r"task.doc_stride=-2 must be >= 1, or 0 \(run_squad's 128\)."),
])
def test_task_objectives_check_their_head_and_windows(objective, change,
                                                      message):
  with pytest.raises(ValueError, match=message):
    _validate(_with(_task(objective), change))


def test_task_objectives_alone_need_no_task_group():
  """The objective outside fine-tuning (tests, tools): no windows to check."""
  for objective in ("token_classify", "span_qa"):
    _validate(_config(objective))
