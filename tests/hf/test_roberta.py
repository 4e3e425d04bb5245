"""RoBERTa and XLM-R and Hugging Face (bert_jax/families/roberta.py):
transformers' own random-init RobertaForMaskedLM / XLMRobertaForMaskedLM
and their task classes import with their logits (fp32, 1e-5, rows padded
with <pad>), our export loads back with no missing key and the same logits,
a bare RobertaModel imports with a fresh LM head, and config.json converts
both ways; positions past the table and a tokenizer whose padding id is not
the model's are refused with one line naming the field."""


import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import pretrained
from bert_jax import tasks
from bert_jax.families import roberta as roberta_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.objectives import roberta as roberta_objective
from bert_jax.training import config_checks
from tests.helpers import torch_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 1  # <pad>, as in RoBERTa's and XLM-R's vocabularies.
T, VOCAB = 24, 97
LENGTHS = (24, 17, 6, 1)
PREFIX = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
HF_CLASS = {"sentence": "ForSequenceClassification",
            "token": "ForTokenClassification", "span": "ForQuestionAnswering"}


@pytest.fixture(autouse=True, scope="module")
def torch_one_thread():
  with torch_reference.one_thread():
    yield


def hf_config(family, **fields):
  cls = getattr(transformers, PREFIX[family] + "Config")
  return cls(**dict(dict(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=48,
      max_position_embeddings=T + PAD + 1, type_vocab_size=1,
      pad_token_id=PAD, layer_norm_eps=1e-5, num_labels=3,
      initializer_range=0.2,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), **fields))


def random_hf_model(family, suffix, path, **fields):
  """transformers' random init of {Prefix}{suffix} (weights of std 0.2: an
  init-sized head gives near-zero logits), every tensor then moved
  by N(0, 0.1) (LayerNorms and biases too: init's ones and zeros would hide
  a swapped or missing one), saved to `path`."""
  torch.manual_seed(0)
  model = getattr(transformers, PREFIX[family] + suffix)(
      hf_config(family, **fields)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model


def batch(seed=0):
  """Rows of real tokens padded with <pad> (ids 3.. are no special)."""
  r = np.random.RandomState(seed)
  mask = (np.arange(T)[None] < np.asarray(LENGTHS)[:, None]).astype(np.int32)
  ids = np.where(mask > 0, r.randint(3, VOCAB, (len(LENGTHS), T)), PAD)
  return ids.astype(np.int32), mask


def theirs(model, ids, mask, kind=None):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids).long(),
                attention_mask=torch.tensor(mask).long())
  if kind == "span":
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  return out.logits.numpy()


def ours(params, model_config, table, ids, mask, key=None):
  model = mapping.make_model(params, model_config, table)
  graphdef, state = nnx.split(model)
  out = jax.jit(lambda s: nnx.merge(graphdef, s)(ids, mask))(state)
  return np.asarray(out[key] if key else out)


def close(a, b, mask=None):
  if mask is not None:
    a, b = a[mask.astype(bool)], b[mask.astype(bool)]
  assert np.abs(b).max() > 0.5  # Not a trivially small comparison.
  np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_masked_lm_imports_and_exports_with_its_logits(tmp_path, family):
  src = str(tmp_path / "hf")
  model = random_hf_model(family, "ForMaskedLM", src)
  source = pretrained.resolve(src)
  assert source.objective == family
  mc = pretrained.load_model_config(source)
  assert (mc.pad_token_id, mc.positions_from_pad, mc.type_vocab_size) == (
      PAD, True, 1)
  params, report = pretrained.load_params(source, mc)
  assert not report.fresh and not report.skipped, report.summary()
  ids, mask = batch()
  want = theirs(model, ids, mask)
  close(ours(params, mc, source.table, ids, mask, "mlm_logits"), want, mask)

  out = str(tmp_path / "ours")
  checkpoint_io.save_hf_model(out, params, mc, table=source.table)
  back, info = getattr(transformers, PREFIX[family] + "ForMaskedLM"
                       ).from_pretrained(out, output_loading_info=True,
                                         dtype=torch.float32)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  close(theirs(back.eval(), ids, mask), want, mask)


@pytest.mark.parametrize("kind", ["sentence", "token", "span"])
@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_task_class_imports_with_its_logits(tmp_path, family, kind):
  src = str(tmp_path / "hf")
  model = random_hf_model(family, HF_CLASS[kind], src,
                          num_labels=2 if kind == "span" else 3)
  source = pretrained.resolve(src)
  assert source.table is compose.task_table(family, kind)
  assert (source.config.objective.name, source.config.objective.encoder) == (
      tasks.get(kind).objective, family)
  params, report = pretrained.load_params(source)
  assert not report.fresh and not report.skipped, report.summary()
  ids, mask = batch(1)
  got = ours(params, source.config.model, source.table, ids, mask)
  close(got, theirs(model, ids, mask, kind),
        None if kind == "sentence" else mask)


def test_bare_model_imports_with_a_fresh_lm_head(tmp_path):
  """A RobertaModel directory (encoder and pooler) reads as a RoBERTa run:
  its encoder gives transformers' hidden states, the LM head is new, the
  pooler (no masked LM has one) is skipped and reported."""
  src = str(tmp_path / "hf")
  model = random_hf_model("roberta", "Model", src)
  source = pretrained.resolve(src)
  assert source.objective == "roberta"
  params, report = pretrained.load_params(source)
  assert report.fresh == ["lm_head"], report.summary()
  assert sorted(report.skipped) == ["pooler.dense.bias",
                                    "pooler.dense.weight"]
  ids, mask = batch(2)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids).long(),
                 attention_mask=torch.tensor(mask).long()
                 ).last_hidden_state.numpy()
  got = ours(params, source.config.model, source.table, ids, mask,
             "sequence_output")
  close(got, want, mask)


def test_config_json_both_ways():
  mc = roberta_objective.published_config("base").model
  hf = roberta_family.config_to_hf(mc, "roberta", "RobertaForMaskedLM")
  assert (hf["pad_token_id"], hf["max_position_embeddings"],
          hf["type_vocab_size"], hf["model_type"]) == (1, 514, 1, "roberta")
  back = roberta_family.config_from_hf(hf)
  for field in checkpoint_io.ARCH_FIELDS:
    assert back[field] == mc[field], field
  with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
    roberta_family.config_from_hf(dict(hf, position_embedding_type="relative_key"))


def test_rows_past_the_position_table_are_refused():
  """512 tokens fill positions 2..513 of RoBERTa's 514; 513 do not fit."""
  config = roberta_objective.published_config("base")
  config.data.seq_length = 512
  config_checks.validate(config, num_devices=1, check_sources=False)
  config.data.seq_length = 513
  with pytest.raises(ValueError, match=(
      r"data.seq_length=513 exceeds model.max_position_embeddings=514 less "
      r"the 2 positions before the first token's")):
    config_checks.validate(config, num_devices=1, check_sources=False)


def test_a_tokenizer_with_another_padding_id_is_refused(tmp_path):
  """Positions count from the padding id: a tokenizer whose [PAD] is 0 with
  a model whose pad_token_id is 1 would shift every position."""
  from bert_jax.data import tokenizers
  path = str(tmp_path / "vocab.txt")
  with open(path, "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
  tok = tokenizers.load(path, "wordpiece")
  config = roberta_objective.published_config("base")
  with pytest.raises(ValueError, match=(
      r"model.pad_token_id=1, but the padding token of the tokenizer .* is "
      r"id 0: .* set --config.model.pad_token_id=0")):
    config_checks.check_tokenizer(config, tok)
  config.model.pad_token_id = 0
  config_checks.check_tokenizer(config, tok)


def test_a_second_segment_reads_the_one_token_type(tmp_path):
  """Sentence-pair rows carry segment ids 1 on their second segment; with
  one token type (RoBERTa's tokenizers give all zeros) they read type 0,
  and the logits are transformers' (whose token_type_ids are zeros)."""
  src = str(tmp_path / "hf")
  model = random_hf_model("roberta", HF_CLASS["sentence"], src)
  source = pretrained.resolve(src)
  params, _ = pretrained.load_params(source)
  ids, mask = batch(3)
  segments = (np.arange(T)[None] >= 5).astype(np.int32) * mask
  net = mapping.make_model(params, source.config.model, source.table)
  got = np.asarray(net(ids, mask, segments))
  close(got, theirs(model, ids, mask))
