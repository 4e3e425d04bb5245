"""Every encoder family with every task kind's head, derived, not listed.

For each family x kind pair the composed objective trains a step, its run
exports as the family's Hugging Face class of that kind
(``{Prefix}ForSequenceClassification``, ...; an embedding run as the bare
``{Prefix}Model``), which transformers loads with no missing or unexpected
keys and the logits (vectors) we compute, and the export imports back as
the same run with the same params and logits (an embedding export: the
same encoder). The registries are complete whatever was imported first.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import export
from bert_jax import families
from bert_jax import pretrained
from bert_jax import tasks
from bert_jax.hf import mapping
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests import helpers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BATCH, SEQ, VOCAB, LABELS = 4, 16, 64, 3
FAMILIES = ("bert", "albert", "electra", "distilbert", "modernbert",
            "roberta", "xlm-roberta")
KINDS = ("sentence", "token", "span", "pairs")
# A family's own model fields (factorized embeddings, no segment table, a
# sliding window shorter than the rows).
FAMILY_MODEL = {
    "bert": {}, "albert": dict(embedding_size=16, hidden_act="gelu_new"),
    "electra": dict(embedding_size=16), "distilbert": dict(type_vocab_size=0),
    "modernbert": dict(type_vocab_size=0, local_attention=8,
                       global_attn_every_n_layers=2, layer_norm_eps=1e-5,
                       classifier_dropout_prob=0.0),
    # One token type; positions from the padding id (1: <pad>), the table
    # two longer than the rows.
    "roberta": dict(type_vocab_size=1, positions_from_pad=True,
                    pad_token_id=1, max_position_embeddings=SEQ + 2),
    "xlm-roberta": dict(type_vocab_size=1, positions_from_pad=True,
                        pad_token_id=1, max_position_embeddings=SEQ + 2)}


def _config(family: str, kind: str):
  config = config_lib.get_config("tiny")
  config.objective.update(name=tasks.get(kind).objective, encoder=family)
  config.model.update(dict(
      dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=2, intermediate_size=64,
           max_position_embeddings=SEQ, num_labels=LABELS,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
      **FAMILY_MODEL[family]))
  if families.get(family).head_layout.pooler_act is not None:
    config.model.pooler_act = families.get(family).head_layout.pooler_act
  config.data.seq_length = SEQ
  config.train.update(batch_size=BATCH, learning_rate=1e-2, warmup_steps=0,
                      num_steps=2)
  return config


def _batch(kind: str, seed: int = 0, pad_id: int = 0) -> dict:
  """A batch of the kind's features: rows of random tokens padded with
  `pad_id`."""
  r = np.random.RandomState(seed)
  lengths = np.asarray([SEQ, 11, 7, 3])
  mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, r.randint(5, VOCAB, (BATCH, SEQ)), pad_id)
  batch = dict(input_ids=ids.astype(np.int32), input_mask=mask,
               segment_ids=np.zeros((BATCH, SEQ), np.int32))
  if kind == "pairs":  # Each row's text and a second one, alone each.
    other = np.roll(batch["input_ids"], 1, axis=0)
    batch = {k: np.stack([v, other if k == "input_ids" else np.roll(
        v, 1, axis=0)], axis=1) for k, v in batch.items()}
    batch.update(text_ids=np.arange(2 * BATCH, dtype=np.int32).reshape(
        BATCH, 2), scores=np.zeros(BATCH, np.float32),
                 example_weights=np.ones(BATCH, np.float32))
  elif kind == "sentence":
    batch.update(labels=r.randint(0, LABELS, BATCH).astype(np.int32),
                 example_weights=np.ones(BATCH, np.float32))
  elif kind == "token":
    batch.update(labels=r.randint(0, LABELS, (BATCH, SEQ)).astype(np.int32),
                 label_weights=mask.astype(np.float32))
  else:
    start = (r.rand(BATCH) * lengths).astype(np.int32)
    batch.update(start_positions=start,
                 end_positions=np.minimum(start + 1, lengths - 1).astype(
                     np.int32),
                 example_weights=np.ones(BATCH, np.float32))
  return batch


def _logits(table, params, model_config, batch) -> np.ndarray:
  """The model's outputs on the batch (a pairs batch: its first texts)."""
  model = mapping.make_model(params, model_config, table)
  if batch["input_ids"].ndim == 3:
    batch = {k: v[:, 0] for k, v in batch.items() if v.ndim == 3}
  return np.asarray(model(batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"]))


def _hf_class(kind: str):
  return {"sentence": transformers.AutoModelForSequenceClassification,
          "token": transformers.AutoModelForTokenClassification,
          "span": transformers.AutoModelForQuestionAnswering,
          "pairs": transformers.AutoModel}[kind]


# Two pairs in the fast tier (a pooler family's sentence head, ModernBERT's
# layout on a per-token output); every pair in the full suite.
FAST_PAIRS = (("bert", "sentence"), ("modernbert", "span"))


@pytest.mark.parametrize("family,kind", [
    pytest.param(f, k, marks=() if (f, k) in FAST_PAIRS else pytest.mark.slow)
    for f in FAMILIES for k in KINDS])
def test_every_family_carries_every_kind(tmp_path, family, kind):
  config = _config(family, kind)
  objective = compose.objective(config)
  assert objective.name == tasks.get(kind).objective
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh),
                                objective)
  batch = _batch(kind, pad_id=config.model.pad_token_id)
  with programs.context():
    state = programs.init()
    before = jax.device_get(state["params"])
    state, metrics = programs.train_step(
        state, sharding.global_batch(batch, programs.batch_sharding))
  params = jax.device_get(state["params"])
  assert np.isfinite(float(metrics["loss"])), metrics
  moved = [k for k, v in mapping.flatten_params(params).items()
           if not np.array_equal(v, mapping.flatten_params(before)[k])]
  assert any(k.startswith(tasks.get(kind).output_name) for k in moved)
  assert any(k.startswith(families.get(family).encoder_attr) for k in moved)

  table = compose.task_table(family, kind)
  cls = families.get(family).class_prefix + tasks.get(kind).hf_suffix
  assert table.export_architecture == cls
  ours = _logits(table, params, config.model, batch)
  out = str(tmp_path / "hf")
  export.write_hf_models(out, params, config, label_names=("a", "b", "c"))
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["architectures"] == [cls]

  # transformers' own class: every key ours, our logits.
  model, info = _hf_class(kind).from_pretrained(
      out, output_loading_info=True, dtype=torch.float32)
  assert type(model).__name__ == cls
  if kind == "pairs":  # An embedding trains no pooler: BertModel's stays
    # transformers' fresh one, unused by the vector.
    info["missing_keys"] = {k for k in info["missing_keys"]
                            if not k.startswith("pooler.")}
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  model.eval()
  first = {k: v[:, 0] if v.ndim == 3 else v for k, v in batch.items()}
  with torch.no_grad():
    got = model(input_ids=torch.from_numpy(first["input_ids"]).long(),
                attention_mask=torch.from_numpy(first["input_mask"]).long())
  real = first["input_mask"].astype(bool)
  if kind == "span":
    theirs = np.stack([got.start_logits.numpy(), got.end_logits.numpy()], -1)
  elif kind == "pairs":  # The mean of the real tokens' last hidden states.
    states = got.last_hidden_state.numpy()
    theirs = (states * real[..., None]).sum(1) / real.sum(1, keepdims=True)
  else:
    theirs = got.logits.numpy()
  pooled = kind in ("sentence", "pairs")
  mine = ours if pooled else ours[real]
  theirs = theirs if pooled else theirs[real]
  np.testing.assert_allclose(mine, theirs, atol=1e-4, rtol=1e-4)
  if kind == "pairs":  # A bare encoder reads back as the family's encoder.
    source = pretrained.resolve(out)
    model_config, encoder = compose.bare_encoder(
        source.config, pretrained.load_params(source)[0])
    back = mapping.flatten_params(encoder)
    assert sorted(back) == sorted(mapping.flatten_params(params))
    for k, v in mapping.flatten_params(params).items():
      np.testing.assert_array_equal(back[k], v, err_msg=k)
    np.testing.assert_array_equal(
        _logits(table, encoder, model_config, batch), ours)
    return

  # Back: the same run (kind on this family), params and logits.
  source = pretrained.resolve(out)
  assert source.table is table
  assert (source.config.objective.name, source.config.objective.encoder) == (
      objective.name, family)
  back, report = pretrained.load_params(source)
  assert not report.fresh and not report.skipped, report.summary()
  helpers_equal = mapping.flatten_params(back)
  for k, v in mapping.flatten_params(params).items():
    np.testing.assert_array_equal(helpers_equal[k], v, err_msg=k)
  np.testing.assert_array_equal(
      _logits(table, back, source.config.model, batch), ours)


def test_a_family_declares_its_head_layout_once():
  """ModernBERT's task classes put its prediction head before every output
  and name every output `classifier`; BERT's pool [CLS] for sentences and
  name the QA output `qa_outputs`: read from the derived tables."""
  hf_heads = lambda family, kind: sorted({
      r.hf.rsplit(".", 1)[0] for r in compose.task_table(family, kind).rows
      if not r.hf.startswith(families.get(family).encoder_table.base_prefix)})
  assert hf_heads("modernbert", "sentence") == hf_heads(
      "modernbert", "span") == ["classifier", "head.dense", "head.norm"]
  assert hf_heads("bert", "sentence") == ["classifier"]
  assert hf_heads("bert", "span") == ["qa_outputs"]
  assert hf_heads("electra", "sentence") == ["classifier.dense",
                                             "classifier.out_proj"]


@pytest.mark.parametrize("family,pooling", [
    ("modernbert", "mean"), pytest.param("modernbert", "cls",
                                         marks=pytest.mark.slow),
    pytest.param("electra", "cls", marks=pytest.mark.slow),
    pytest.param("roberta", "cls", marks=pytest.mark.slow)])
def test_a_packed_row_gives_each_examples_own_sentence_logits(family,
                                                              pooling):
  """The sentence head on packed rows (data.packing): each packed example's
  logits equal that example's alone, padded, for a family that pools its
  tokens ([CLS] or the mean over the example's own tokens, ModernBERT) and
  those whose pooler reads each example's [CLS] (ELECTRA; RoBERTa, whose
  positions restart after the padding id in each example)."""
  config = _config(family, "sentence")
  config.model.classifier_pooling = pooling
  model = compose.objective(config).make_model(config, nnx.Rngs(0))
  r = np.random.RandomState(0)
  examples = [np.concatenate([[2], r.randint(5, VOCAB, n - 2), [3]])
              for n in (5, 7, 3)]
  ids, seq, pos = (np.zeros((1, SEQ), np.int32) for _ in range(3))
  cls = np.zeros((1, 4), np.int32)
  start = 0
  for i, e in enumerate(examples):
    ids[0, start:start + len(e)] = e
    seq[0, start:start + len(e)] = i + 1
    pos[0, start:start + len(e)] = np.arange(len(e))
    cls[0, i] = start
    start += len(e)
  packed = np.asarray(model(ids, (seq > 0).astype(np.int32),
                            np.zeros_like(ids), sequence_ids=seq,
                            position_ids=pos, cls_positions=cls))
  assert packed.shape == (1, 4, LABELS)
  for i, e in enumerate(examples):
    alone = np.zeros((1, SEQ), np.int32)
    alone[0, :len(e)] = e
    want = np.asarray(model(alone, (alone > 0).astype(np.int32),
                            np.zeros_like(alone)))[0]
    np.testing.assert_allclose(packed[0, i], want, atol=2e-5, err_msg=i)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_directory_of_every_class_reads_as_its_run(family):
  """config.json of each task class (and of the family's pretraining
  classes) names the table that wrote it and the run it implies."""
  fam = families.get(family)
  for kind in KINDS:
    config = _config(family, kind)
    table = compose.task_table(family, kind)
    hf_config = dict(table.config_to_hf(config.model),  # As an export's.
                     **table.config_fields(config.model, ()))
    if kind == "pairs":
      # The bare {Prefix}Model: its config.json is the family's encoder
      # (ELECTRA's discriminator alone: half a pretraining pair); the
      # sentence-transformers modules beside it (test_sentence_transformers)
      # make it an embedding model.
      assert hf_config["architectures"] == [f"{fam.class_prefix}Model"]
      continue
    read, run = compose.hf_directory(hf_config)
    assert read is table
    assert run["objective"] == {"name": tasks.get(kind).objective,
                                "encoder": family}
    assert run["model"]["num_labels"] == (LABELS if kind != "span" else 2)
  for table in fam.pretraining_tables:
    config = _config(family, "sentence")
    if family == "electra":  # One network is half a run: refused.
      with pytest.raises(ValueError, match="half of an ELECTRA pair"):
        compose.hf_directory(table.config_to_hf(config.model))
      continue
    read, run = compose.hf_directory(table.config_to_hf(config.model))
    assert read is table
    assert run["objective"]["name"] == fam.objectives[0].name


def test_run_configs_naming_the_head_by_family_read_as_kind_and_encoder():
  for old, want in (("modernbert_classify", ("classify", "modernbert")),
                    ("modernbert_token_classify", ("token_classify",
                                                   "modernbert")),
                    ("modernbert_span_qa", ("span_qa", "modernbert"))):
    o = config_lib.complete({"objective": {"name": old}}).objective
    assert (o.name, o.encoder) == want
  o = config_lib.complete({"objective": {"name": "classify",
                                         "encoder": "distil"}}).objective
  assert (o.name, o.encoder) == ("classify", "distilbert")
  assert compose.family(config_lib.complete(
      {"objective": {"name": "distil"}})).name == "distilbert"


def test_names_that_name_nothing_are_one_line():
  config = config_lib.get_config("tiny")
  config.objective.name = "nope"
  with pytest.raises(ValueError, match=r"objective.name='nope' is not one "
                     r"of 'bert', .*'span_qa'"):
    compose.objective(config)
  config.objective.update(name="classify", encoder="gpt2")
  with pytest.raises(ValueError, match=r"objective.encoder='gpt2' is not one "
                     r"of 'bert', 'albert', 'electra', 'distilbert', "
                     r"'modernbert'"):
    compose.objective(config)
  with pytest.raises(ValueError, match="model_type='gpt2'"):
    compose.hf_directory({"model_type": "gpt2"})


_REGISTRY_CHILD = """
import sys
for module in sys.argv[1:]:
  __import__(module)
from bert_jax import compose, families, tasks
print(sorted(families.names()), sorted(tasks.names()),
      sorted(compose.objective_names()))
"""


@pytest.mark.slow
def test_registries_do_not_depend_on_what_was_imported_first():
  outputs = set()
  for first in ([], ["bert_jax.tasks.span"], ["bert_jax.families.modernbert"],
                ["bert_jax.compose"], ["bert_jax.pretrained"]):
    res = subprocess.run([sys.executable, "-c", _REGISTRY_CHILD, *first],
                         cwd=helpers.REPO, env=helpers.child_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    outputs.add(res.stdout.strip().splitlines()[-1])
  assert len(outputs) == 1, outputs
  (line,) = outputs
  assert all(f"'{f}'" in line for f in FAMILIES + KINDS), line
