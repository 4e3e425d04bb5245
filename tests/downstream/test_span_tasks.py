"""Extractive QA (SQuAD 2.0 format) end to end: learns a generated task
with contexts longer than a window, finds answers that lie only in later
windows or across window borders, detects unanswerable questions, writes
the official predictions.json / null_odds.json (and run_squad's
nbest_predictions.json), resumes exactly, and exports to a Hugging Face
BertForQuestionAnswering that answers the same.

transformers 5 removed ``pipeline("question-answering")``; the reference
here is what that pipeline did (transformers 4.x ``QuestionAnsweringPipeline``
with a fast tokenizer), written out: Hugging Face's tokenizer makes the
windows (``return_overflowing_tokens``, ``stride``, offsets), PyTorch's
``BertForQuestionAnswering`` scores them, and each window's start / end
logits become probabilities (softmax over context tokens and [CLS]); the
answer is the best product over windows and the null answer the smallest
[CLS] product. Nothing of bert_jax is used there.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.data import span_features
from bert_jax.data import squad_sources
from bert_jax.data import tokenizers
from bert_jax.downstream import finetuning
from bert_jax.tasks import squad_metrics
from tests import helpers
from tests.helpers import in_process
from tests.helpers import span_tag_tasks
from tests.helpers import tiny_models

pytestmark = pytest.mark.slow

NUM_STEPS, SAVE_AT = 80, 40
SEQ, STRIDE, MAX_QUERY, MAX_ANSWER = 64, 24, 16, 30


def qa_config(init_from, train, dev):
  config = tiny_models.finetune_config(init_from, train, dev,
                                       num_steps=NUM_STEPS,
                                       learning_rate=3e-3)
  config.task.update(name="generated_qa", kind="span", buckets=(SEQ,),
                     doc_stride=STRIDE, max_query_length=MAX_QUERY,
                     max_answer_length=MAX_ANSWER)
  config.data.seq_length = SEQ
  config.train.update(log_every=1, warmup_steps=10, warmup_fraction=0.0,
                      batch_size=32)
  config.checkpoint.update(save_every_steps=SAVE_AT, max_to_keep=5)
  return config


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
  d = tmp_path_factory.mktemp("span_tasks")
  hf = tiny_models.make_hf_dir(str(d / "base"))
  # The question is 5 tokens: windows of SEQ - 8 context tokens.
  train, dev = span_tag_tasks.write_qa_task(str(d / "data"),
                                            border=SEQ - 8 - 1)
  config = qa_config(hf["out"], train, dev)
  workdir = str(d / "learned")
  return dict(results=finetuning.run(config, workdir), workdir=workdir,
              config=config, dev=dev, hf=hf, dir=d)


def _read(workdir, name):
  with open(os.path.join(workdir, "predictions", "validation", name)) as f:
    return json.load(f)


def _dev_windows(learned):
  examples, _ = squad_sources.read_json(learned["dev"])
  tok = tokenizers.load(learned["hf"]["vocab_path"], "wordpiece", True)
  features, span_map = span_features.build(
      examples, tok, seq_length=SEQ, max_query_length=MAX_QUERY,
      doc_stride=STRIDE)
  return examples, features, span_map


def test_generated_qa_is_learned_with_windows_and_null_answers(learned):
  scores = learned["results"]["scores"]["validation"]
  assert scores["exact"] >= 0.9, scores
  assert scores["NoAns_exact"] >= 0.9, scores  # unanswerable detected
  assert scores["HasAns_exact"] >= 0.9, scores
  examples, features, span_map = _dev_windows(learned)
  predictions = _read(learned["workdir"], "predictions.json")
  later, across = [], []
  for i, windows in enumerate(span_map.windows_of()):
    ex = examples[i]
    if not ex.answers:
      continue
    holding = features.arrays["start_positions"][windows] > 0
    first, last = span_features.answer_tokens(
        span_map.char_starts[i], span_map.char_ends[i], ex.answers[0][1],
        ex.answers[0][1] + len(ex.answers[0][0]))
    if not holding[0]:
      later.append(ex.id)  # the answer is only in a later window
    for f in windows:  # a window holding its start but not its end
      t0, n = span_map.token_start[f], span_map.num_context[f]
      if t0 <= first < t0 + n <= last:
        across.append(ex.id)
  assert len(later) >= 20 and len(across) >= 5, (len(later), len(across))
  for ids in (later, across):
    right = sum(predictions[q] == examples[[e.id for e in examples].index(
        q)].answers[0][0] for q in ids)
    assert right >= 0.9 * len(ids), (right, len(ids))


def test_predictions_and_null_odds_are_the_official_files(learned):
  workdir, results = learned["workdir"], learned["results"]
  predictions = _read(workdir, "predictions.json")
  null_odds = _read(workdir, "null_odds.json")
  examples, _ = squad_sources.read_json(learned["dev"])
  ids = [e.id for e in examples]
  assert sorted(predictions) == sorted(null_odds) == sorted(ids)
  assert all(isinstance(v, str) for v in predictions.values())
  assert all(isinstance(v, float) for v in null_odds.values())
  # Null predicted exactly where the odds exceed the threshold (0).
  assert all((predictions[q] == "") == (null_odds[q] > 0) for q in ids)
  # run_squad's nbest_predictions.json: per question at most n_best
  # distinct texts best first, the null answer "" among them (v2), the
  # probabilities a softmax over the list; the first span is the answer.
  nbest = _read(workdir, "nbest_predictions.json")
  assert sorted(nbest) == sorted(ids)
  n_best = learned["config"].task.n_best_size
  for q in ids:
    texts = [e["text"] for e in nbest[q]]
    assert len(texts) == len(set(texts)) <= n_best + 1 and "" in texts
    total = np.array([e["start_logit"] + e["end_logit"] for e in nbest[q]])
    ranked = total[:-1] if texts[-1] == "" else total  # null appended
    assert np.all(np.diff(ranked) <= 0)
    np.testing.assert_allclose([e["probability"] for e in nbest[q]],
                               np.exp(total) / np.exp(total).sum(),
                               rtol=1e-6)
    if predictions[q]:
      assert predictions[q] == next(t for t in texts if t)
  # The files alone give the reported numbers (evaluate-v2.0.py's path).
  gold = {e.id: [t for t, _ in e.answers] for e in examples}
  scores, extras = squad_metrics.evaluate(
      gold, predictions, True, null_odds,
      na_prob_thresh=learned["config"].task.null_score_diff_threshold)
  assert scores == results["scores"]["validation"]
  details = results["details"]["validation"]
  assert details["best_f1_thresh"] == extras["best_f1_thresh"]
  assert details["HasAns_total"] + details["NoAns_total"] == len(ids)
  saved = json.loads(open(os.path.join(workdir, "results.json")).read())
  assert saved["kind"] == "span" and saved["label_names"] == []


def test_rerun_after_a_kill_continues_with_the_same_losses(learned):
  whole = learned["workdir"]
  part = str(learned["dir"] / "part")
  shutil.copytree(whole, part)
  for step in os.listdir(os.path.join(part, "checkpoints")):
    if step.isdigit() and int(step) > SAVE_AT:
      shutil.rmtree(os.path.join(part, "checkpoints", step))
  os.remove(os.path.join(part, "metrics.jsonl"))

  def losses(workdir):
    rows = [json.loads(line) for line in open(os.path.join(
        workdir, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}

  finetuning.run(learned["config"], part)
  resumed, expected = losses(part), losses(whole)
  assert sorted(resumed) == list(range(SAVE_AT + 1, NUM_STEPS + 1))
  for step, loss in resumed.items():
    assert loss == expected[step], (step, loss, expected[step])


# --- Hugging Face export -----------------------------------------------------
def hf_reference_answers(model_dir, examples, *, seq_length, doc_stride,
                         max_answer_len, handle_impossible):
  """transformers 4.x QuestionAnsweringPipeline's answers (top 1), written
  out for transformers 5 (which removed it). `doc_stride` is ours (tokens
  between window starts); Hugging Face's `stride` is the overlap."""
  import torch
  import transformers
  torch.set_num_threads(1)  # Two threads on two busy cores crawl.
  tok = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.BertForQuestionAnswering.from_pretrained(model_dir)
  model.eval()
  out, windows = {}, {}
  for ex in examples:
    q = len(tok(ex.question, add_special_tokens=False)["input_ids"])
    overlap = (seq_length - q - 3) - doc_stride
    enc = tok(ex.question, ex.context, truncation="only_second",
              max_length=seq_length, stride=overlap,
              return_overflowing_tokens=True, return_offsets_mapping=True)
    windows[ex.id] = enc["input_ids"]
    best, min_null = None, 1e6
    for k, ids in enumerate(enc["input_ids"]):
      with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]),
                       token_type_ids=torch.tensor([enc["token_type_ids"][k]]))
      seq_ids = enc.sequence_ids(k)
      allowed = np.array([s == 1 for s in seq_ids])
      allowed[0] = True  # [CLS] stays in the softmax
      probs = []
      for x in (logits.start_logits[0].numpy(), logits.end_logits[0].numpy()):
        x = np.where(allowed, x, -10000.0)
        e = np.exp(x - x.max())
        probs.append(e / e.sum())
      ps, pe = probs
      min_null = min(min_null, float(ps[0] * pe[0]))
      ps[0] = pe[0] = 0.0
      outer = np.tril(np.triu(np.outer(ps, pe)), max_answer_len - 1)
      s, e = np.unravel_index(int(np.argmax(outer)), outer.shape)
      if seq_ids[s] == 1 and seq_ids[e] == 1:
        offsets = enc["offset_mapping"][k]
        score = float(outer[s, e])
        if best is None or score > best[0]:
          best = (score, ex.context[offsets[s][0]:offsets[e][1]])
    answer = best[1] if best is not None else ""
    if handle_impossible and (best is None or min_null > best[0]):
      answer = ""
    out[ex.id] = answer
  return out, windows


@pytest.fixture(scope="module")
def exported(learned):
  pytest.importorskip("torch")
  from bert_jax import export
  out = learned["workdir"] + "_hf"
  export.export_run(learned["workdir"], out)
  return out


def test_export_answers_as_hugging_face_does(learned, exported):
  pytest.importorskip("transformers")
  cfg = json.loads(open(os.path.join(exported, "config.json")).read())
  assert cfg["architectures"] == ["BertForQuestionAnswering"]
  examples, features, span_map = _dev_windows(learned)
  theirs, windows = hf_reference_answers(
      exported, examples, seq_length=SEQ, doc_stride=STRIDE,
      max_answer_len=MAX_ANSWER, handle_impossible=True)
  # Their windows are ours, token for token.
  for i, rows in enumerate(span_map.windows_of()):
    ids = windows[examples[i].id]
    assert len(ids) == len(rows)
    for f, hf_ids in zip(rows, ids):
      n = features.lengths[f]
      assert features.input_ids[f, :n].tolist() == hf_ids
  ours = _read(learned["workdir"], "predictions.json")
  same = sum(ours[q] == theirs[q] for q in ours)
  print(f"Hugging Face agrees on {same}/{len(ours)} answers")
  # Documented difference: HF compares per-window softmax probabilities
  # (and the null as a probability product), we compare logit sums (and
  # null odds with threshold 0); they differ only on close calls.
  assert same >= 0.99 * len(ours), same


def test_squad_answer_start_off_its_text_is_one_line(learned, tmp_path):
  """On the command line: one line (after absl's), exit 1, nothing written."""
  bad = tmp_path / "train.json"
  bad.write_text(json.dumps({"data": [{"paragraphs": [{
      "context": "Paris is in France.", "qas": [{
          "id": "q1", "question": "Where?",
          "answers": [{"text": "France", "answer_start": 3}]}]}]}]}))
  result = in_process.run_module(
      "finetune", "--config",
      os.path.join(helpers.REPO, "configs", "squad.py"), "--workdir",
      str(tmp_path / "out"), "--config.task.name=mine",
      f"--config.task.train_file={bad}",
      f"--config.task.validation_file={learned['dev']}",
      f"--config.train.init_from={learned['hf']['out']}")
  lines = helpers.failure_lines(result)  # absl's E line, then error:.
  assert lines[-1] == (
      f"error: {bad}: question 'q1': answer_start=3 points at 'is is ', "
      "not at the answer text 'France'."), lines
  assert helpers.written_files(tmp_path / "out") == []


def test_no_room_for_the_context_is_refused_before_anything_is_written(
    learned, tmp_path):
  """span_qa's own check (its validate hook) runs before the workdir is
  taken: a question budget that leaves no context token is one error."""
  config = qa_config(learned["hf"]["out"], learned["dev"], learned["dev"])
  config.task.max_query_length = SEQ - 3
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "out"))
  assert str(e.value) == (
      f"data.seq_length={SEQ} must exceed task.max_query_length={SEQ - 3} + 3"
      " ([CLS] and two [SEP]) to leave room for the context.")
  assert helpers.written_files(tmp_path / "out") == []


PHASES_REFUSED = ("train.phases / train.recipe apply to pretraining runs only "
                  "(a fine-tuning run's batches are its task's length "
                  "buckets, task.buckets); leave them empty.")


@pytest.mark.parametrize("case",
                         ["label_names", "phases", "empty_dev", "packing"])
def test_bad_setup_is_one_error_before_anything_is_written(learned, tmp_path,
                                                           case):
  """Sentence tasks' refusals that apply to a span task: label names (it
  has no classes), phases, an empty split (named with its file); packed
  rows (span windows stay length-bucketed)."""
  config = qa_config(learned["hf"]["out"], learned["dev"], learned["dev"])
  empty = tmp_path / "empty.json"
  empty.write_text(json.dumps({"version": "v2.0", "data": []}))
  if case == "label_names":
    config.task.label_names = ("start", "end")
    expected = ("task.label_names=('start', 'end'): a span task has no "
                "classes (the head marks an answer's start and end); leave "
                "task.label_names empty.")
  elif case == "phases":
    config.train.phases = (dict(num_steps=2, seq_length=SEQ),) * 2
    expected = PHASES_REFUSED
  elif case == "packing":  # Span windows stay length-bucketed.
    config.data.packing = True
    expected = ("data.packing=True with task.kind='span': packed fine-tuning "
                "rows hold sentence, token and pairs tasks only; span tasks "
                "batch their windows by length buckets: set "
                "data.packing=False.")
  else:
    config.task.validation_file = str(empty)
    expected = ("The validation split of task 'generated_qa' (task."
                f"validation_file={empty}) holds no question.")
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "out"))
  assert str(e.value) == expected
  assert helpers.written_files(tmp_path / "out") == []
