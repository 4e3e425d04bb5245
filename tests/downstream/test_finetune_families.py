"""Fine-tuning starts from any family: the family's encoder of a run
(``compose.encoder_config`` / ``encoder_params``) turns an ELECTRA, ALBERT
or DistilBERT run's params into the BertModel a task head wraps, computing
exactly what the family's own encoder computed."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from bert_jax import config_lib
from bert_jax import compose
from bert_jax import pretrained
from bert_jax import tasks
from bert_jax.downstream import finetuning
from bert_jax.models import bert as bert_model
from tests import helpers

VOCAB, SEQ = 128, 16


def _config(family: str):
  c = config_lib.get_config("tiny")
  c.model.update(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
                 num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=32, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
  if family == "electra":
    c.objective.name = "electra"
    c.model.embedding_size = 32
  elif family.startswith("albert"):  # albert3: 3 groups of 1 layer.
    c.objective.name = "albert"
    c.model.update(embedding_size=24, hidden_act="gelu_new",
                   num_hidden_groups=3 if family == "albert3" else 1)
  elif family == "distil":
    c.objective.update(name="distil", teacher="random", student_layers=2)
  return c


def _inputs():
  r = np.random.RandomState(1)
  ids = jnp.asarray(r.randint(5, VOCAB, (2, SEQ)), jnp.int32)
  mask = jnp.ones((2, SEQ), jnp.int32).at[1, 11:].set(0)
  return ids, mask, jnp.zeros((2, SEQ), jnp.int32)


def _family_sequence_output(family, module, ids, mask, seg):
  """[B,T,H] of the family's own pretrained encoder."""
  if family == "electra":
    x = module.embeddings(ids, seg, deterministic=True, rngs=None)
    return module.discriminator.encoder(x, mask)
  if family.startswith("albert"):
    return module.albert(ids, mask, seg)[0]
  return module(ids, mask, seg)["sequence_output"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["electra", "albert", "albert3", "distil"])
def test_encoder_hooks_rebuild_the_family_encoder(family):
  config = _config(family)
  objective = compose.objective(config)
  run_model = objective.make_model(config, nnx.Rngs(0))
  params = helpers.noised_params(run_model)
  nnx.update(run_model, params)
  enc_config = compose.encoder_config(config)
  bert = bert_model.BertModel(enc_config, rngs=nnx.Rngs(1))
  graphdef, fresh = nnx.split(bert, nnx.Param)
  fresh = fresh.to_pure_dict()
  encoder = compose.encoder_params(config, params)["bert"]
  # Everything but a pooler the family did not train comes from the run.
  assert set(fresh) - set(encoder) <= {"pooler"}
  assert ("pooler" in encoder) == family.startswith("albert")
  merged = nnx.merge(graphdef, {**fresh, **encoder})
  ids, mask, seg = _inputs()
  ours, _ = merged(ids, mask, seg)
  theirs = _family_sequence_output(family, run_model, ids, mask, seg)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5)


def test_electra_source_fine_tunes_its_discriminator():
  """finetune's model config for an ELECTRA run is the discriminator's
  (factorized embeddings kept), for DistilBERT the student's."""
  source = lambda c: pretrained.Source(pretrained.WORKDIR, "/x", config=c)
  m = finetuning.encoder_model_config(source(_config("electra")))
  assert (m.hidden_size, m.embedding_size, m.num_hidden_layers) == (64, 32, 3)
  d = finetuning.encoder_model_config(source(_config("distil")))
  assert (d.num_hidden_layers, d.type_vocab_size) == (2, 0)


def test_pretraining_bert_still_refuses_factorized_embeddings():
  c = _config("bert")
  c.model.embedding_size = 32
  with pytest.raises(ValueError, match="BERT has no embedding projection"):
    bert_model.BertForPreTraining(c.model, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("family", ["albert", "electra"])
@pytest.mark.parametrize("head", ["token", "span"])
def test_token_and_qa_heads_wrap_any_family_encoder(family, head):
  """A token or QA model (no pooler) gets every encoder param the family
  hook gives except a pooler, and then computes the family's sequence
  output under its head."""
  config = _config(family)
  objective = compose.objective(config)
  run_model = objective.make_model(config, nnx.Rngs(0))
  params = helpers.noised_params(run_model)
  nnx.update(run_model, params)
  enc_config = ml_collections.ConfigDict(
      compose.encoder_config(config).to_dict())
  enc_config.num_labels = 5
  model = compose.task_model(compose.family(config), tasks.get(head),
                             enc_config, nnx.Rngs(1))
  graphdef, fresh = nnx.split(model, nnx.Param)
  merged, left_fresh = finetuning._with_encoder(  # pylint: disable=protected-access
      fresh.to_pure_dict(), compose.encoder_params(config, params))
  assert "pooler" not in merged["bert"] and left_fresh == []
  ids, mask, seg = _inputs()
  ours, _ = nnx.merge(graphdef, merged).bert(ids, mask, seg)
  theirs = _family_sequence_output(family, run_model, ids, mask, seg)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5)


def test_distilbert_encoder_is_fine_tuned_with_the_data_settings_untouched():
  """A DistilBERT student has no segment table: the fine-tuning config keeps
  data.objective / data.nsp as set (pretraining's sentence-pair check is not
  the task's) and passes the task's checks."""
  from bert_jax.data import task_sources
  from bert_jax.training import config_checks
  from tests.helpers import tiny_models
  source = pretrained.Source(pretrained.WORKDIR, "/distil_run",
                             config=_config("distil"))
  config = tiny_models.finetune_config("/distil_run", "train.csv", "dev.csv")
  spec = task_sources.TaskSpec("kw", ("text",), label_names=("neg", "pos"))
  resolved = finetuning.resolve_config(config, source, spec, num_train=64)
  assert resolved.model.type_vocab_size == 0
  assert resolved.data.to_dict() == config.data.to_dict()
  assert config_lib.sentence_objective(resolved.data) == "nsp"
  config_checks.validate(resolved, num_devices=1, check_sources=False)
