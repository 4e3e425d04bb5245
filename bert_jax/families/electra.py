"""ELECTRA (Clark et al. 2020): the discriminator / generator pair, one
Hugging Face table per network, both ways, and through the task kinds
ELECTRA's task classes on the discriminator's encoder.

The tables (``DISCRIMINATOR_TABLE``, ``GENERATOR_TABLE``) are built from
BERT's rows (the same embeddings and layers under ELECTRA's names); their
``make_model`` builds the network alone (``electra_model.Electra
{Discriminator,Generator}Model``) and their ``config_to_hf`` writes its
ElectraConfig. A run exports as a pair:

  OUT/discriminator/   ElectraForPreTraining (config.json, model.safetensors,
                       tokenizer files): replaced-token logits, the encoder
                       to fine-tune.
  OUT/generator/       ElectraForMaskedLM (same files): the MLM generator;
                       ``pipeline("fill-mask", model=OUT/generator)`` works.

Both carry a copy of the shared embeddings (``electra.embeddings.*``), as
Google's released pairs do; the generator's ``generator_lm_head.weight`` is
the tied word-embedding table. Import reads such a pair (or Google's released
``electra-*-discriminator`` / ``electra-*-generator`` directories) back into
our tree; the embeddings must agree between the two (they were one table).

Fine-tuning reads the discriminator (as the paper fine-tunes it):
``models.bert.BertModel`` with the E -> H projection when E != H, its
pooler the dense + gelu of Hugging Face's ``ElectraClassificationHead``
(``classifier.dense``, then ``classifier.out_proj``).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Mapping

import ml_collections
import numpy as np

from bert_jax import config_lib
from bert_jax.families import Family
from bert_jax.families import bert as bert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing
from bert_jax.hf import mapping
from bert_jax.hf.mapping import Row
from bert_jax.hf.mapping import Table
from bert_jax.models import bert as bert_model
from bert_jax.models import electra as electra_model
from bert_jax.models import heads
from bert_jax.objectives import electra as electra_objective

DISCRIMINATOR, GENERATOR = "discriminator", "generator"
NETWORKS = (DISCRIMINATOR, GENERATOR)
ARCHITECTURES = {DISCRIMINATOR: "ElectraForPreTraining",
                 GENERATOR: "ElectraForMaskedLM"}
# The params both networks read (one table in our tree, a copy in each HF
# model).
SHARED = "embeddings"


def _bert_rows(network: str) -> tuple[tuple[Row, ...], tuple[Row, ...]]:
  """(embedding rows, layer rows) of one network: BERT's, renamed.

  BERT's ``bert.embeddings.*`` are our shared ``embeddings.*`` (HF
  ``electra.embeddings.*``); its ``bert.layers.{i}.*`` are the network's
  ``<network>.encoder.layers.{i}.*`` (HF ``electra.encoder.layer.{i}.*``).
  Google's TF names are not mapped.
  """
  embeddings, layers = [], []
  for r in bert_family.BERT.rows:
    hf = "electra." + r.hf[len("bert."):]
    if r.ours.startswith("bert.embeddings."):
      embeddings.append(Row(r.ours[len("bert."):], hf, "", r.transpose_hf,
                            False))
    elif r.ours.startswith("bert.layers."):
      layers.append(Row(f"{network}.encoder." + r.ours[len("bert."):], hf, "",
                        r.transpose_hf, False))
  return tuple(embeddings), tuple(layers)


def _project_rows(network: str) -> tuple[Row, ...]:
  """The E -> H projection: only when the network's hidden size differs
  from embedding_size (Table.optional)."""
  return (
      Row(f"{network}.encoder.embeddings_project.kernel", "electra.embeddings_project.weight", "", True, False),
      Row(f"{network}.encoder.embeddings_project.bias", "electra.embeddings_project.bias", "", False, False),
  )


HEAD_ROWS = {
    DISCRIMINATOR: (
        Row("discriminator.head.dense.kernel", "discriminator_predictions.dense.weight", "", True, False),
        Row("discriminator.head.dense.bias", "discriminator_predictions.dense.bias", "", False, False),
        Row("discriminator.head.dense_prediction.kernel", "discriminator_predictions.dense_prediction.weight", "", True, False),
        Row("discriminator.head.dense_prediction.bias", "discriminator_predictions.dense_prediction.bias", "", False, False),
    ),
    GENERATOR: (
        Row("generator.mlm_head.transform.kernel", "generator_predictions.dense.weight", "", True, False),
        Row("generator.mlm_head.transform.bias", "generator_predictions.dense.bias", "", False, False),
        Row("generator.mlm_head.layer_norm.scale", "generator_predictions.LayerNorm.weight", "", False, False),
        Row("generator.mlm_head.layer_norm.bias", "generator_predictions.LayerNorm.bias", "", False, False),
        Row("generator.mlm_head.bias", "generator_lm_head.bias", "", False, False),
    ),
}
# HF keys that are copies of another key (the generator's tied decoder).
TIED_HF_KEYS = {GENERATOR: {
    "generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}}
# ElectraConfig fields that are our model config's, by the same name.
CONFIG_FIELDS = ("vocab_size", "embedding_size", "hidden_size",
                 "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "hidden_act", "hidden_dropout_prob",
                 "attention_probs_dropout_prob", "max_position_embeddings",
                 "type_vocab_size", "initializer_range", "layer_norm_eps")


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------
def network_config(config, network: str) -> ml_collections.ConfigDict:
  """Our model config of one network (the generator's is derived)."""
  if network == GENERATOR:
    return electra_model.generator_config(config)
  net = ml_collections.ConfigDict(config.model.to_dict())
  net.embedding_size = bert_model.embedding_size(config.model)
  return net


def _config_to_hf(network: str, model_config, pad_token_id: int = 0) -> dict:
  """One network's model config -> its ElectraConfig dict (config.json)."""
  cfg = {"architectures": [ARCHITECTURES[network]], "model_type": "electra"}
  for f in CONFIG_FIELDS:
    v = model_config[f]
    cfg[f] = v if isinstance(v, str) else (
        float(v) if isinstance(v, float) else int(v))
  cfg.update(pad_token_id=int(pad_token_id), position_embedding_type="absolute",
             tie_word_embeddings=True, dtype="float32")
  return cfg


def _config_from_hf(hf_cfg: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """An ElectraConfig dict -> the model config of that network."""
  if hf_cfg.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"config.json hidden_act={hf_cfg['hidden_act']!r}: only "
                     "exact 'gelu' is implemented.")
  mc = config_lib.model_config("base")
  for f in CONFIG_FIELDS:
    if f in hf_cfg:
      mc[f] = type(mc[f])(hf_cfg[f])
  return mc


def pair_config(disc_cfg: Mapping[str, Any], gen_cfg: Mapping[str, Any]
                ) -> tuple[ml_collections.ConfigDict, dict]:
  """Two ElectraConfig dicts -> (our model config: the discriminator's, the
  ``objective`` fields that size the generator)."""
  for name, c in ((DISCRIMINATOR, disc_cfg), (GENERATOR, gen_cfg)):
    if c.get("model_type") != "electra":
      raise ValueError(f"{name}/config.json has model_type="
                       f"{c.get('model_type')!r}, not 'electra'.")
  for f in ("vocab_size", "embedding_size", "max_position_embeddings",
            "type_vocab_size"):
    if disc_cfg.get(f) != gen_cfg.get(f):
      raise ValueError(f"The generator's {f}={gen_cfg.get(f)} differs from "
                       f"the discriminator's {disc_cfg.get(f)}: they share "
                       "embeddings, so these must be equal.")
  model = _config_from_hf(disc_cfg)
  _config_from_hf(gen_cfg)  # Its activation is checked too.
  h, layers = disc_cfg["hidden_size"], disc_cfg["num_hidden_layers"]
  return model, dict(
      generator_hidden_size=gen_cfg["hidden_size"] / h,
      generator_layers=gen_cfg["num_hidden_layers"] / layers,
      generator_num_attention_heads=int(gen_cfg["num_attention_heads"]),
      generator_intermediate_size=int(gen_cfg["intermediate_size"]))


def is_pair(path: str) -> bool:
  """Whether `path` holds discriminator/ and generator/ HF directories."""
  return all(os.path.isfile(os.path.join(path, net, "config.json"))
             for net in NETWORKS)


def read_pair_config(path: str) -> tuple[ml_collections.ConfigDict, dict]:
  """PATH/discriminator + PATH/generator config.json -> :func:`pair_config`."""
  cfgs = {}
  for n in NETWORKS:
    d = os.path.join(path, n)
    cfg = checkpoint_io.read_hf_config(d) if os.path.isdir(d) else None
    if cfg is None:
      raise FileNotFoundError(
          f"{d}/config.json not found: an ELECTRA directory holds "
          "discriminator/ and generator/ Hugging Face model directories.")
    cfgs[n] = cfg
  return pair_config(cfgs[DISCRIMINATOR], cfgs[GENERATOR])


def check_same_generator(src, dst, path: str) -> None:
  """ValueError naming the objective field when the generators differ."""
  a, b = (electra_model.generator_config(c) for c in (src, dst))
  for f in ("hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size"):
    if a[f] != b[f]:
      raise ValueError(
          f"{path} has a generator with {f}={a[f]}, but the config gives "
          f"{b[f]}; set objective.generator_hidden_size="
          f"{src.objective.generator_hidden_size}, generator_layers="
          f"{src.objective.generator_layers}, generator_num_attention_heads="
          f"{src.objective.generator_num_attention_heads} and "
          "generator_intermediate_size="
          f"{src.objective.generator_intermediate_size}.")


# --------------------------------------------------------------------------
# Params: the pair's tree <-> one tree per network
# --------------------------------------------------------------------------
def network_params(params: Mapping[str, Any], network: str) -> dict:
  """The subtree one network's HF model holds: the shared embeddings and
  the network. ValueError on params that belong to neither network."""
  extra = sorted(set(params) - {SHARED, *NETWORKS})
  if extra:
    raise ValueError(f"Params not in the ELECTRA tables: {extra[:5]}.")
  return {SHARED: params[SHARED], network: params[network]}


def from_hf_state_dicts(state_dicts: Mapping[str, Mapping[str, Any]], config
                        ) -> dict:
  """{"discriminator": sd, "generator": sd} -> our tree (exact copies), each
  read by its family's table; the shared embeddings must be equal in both
  (a ValueError names the first that is not)."""
  trees = {n: importing.from_hf_state_dict(
      state_dicts[n], network_config(config, n), TABLES[n])[0]
           for n in NETWORKS}
  disc, gen = (mapping.flatten_params(trees[n][SHARED]) for n in NETWORKS)
  hf_names = {r.ours: r.hf for r in TABLES[GENERATOR].rows}
  for key, x in disc.items():
    if not np.array_equal(x, gen[key]):
      raise ValueError(
          f"{hf_names[f'{SHARED}.{key}']} differs between the discriminator "
          f"and the generator (max |diff| {np.max(np.abs(x - gen[key])):.3g}"
          "); ELECTRA shares the embeddings, so both must hold the same "
          "table.")
  return {SHARED: trees[DISCRIMINATOR][SHARED],
          **{n: trees[n][n] for n in NETWORKS}}


def load_pair(path: str, config) -> dict:
  """An export (or a released pair: PATH/discriminator + PATH/generator)
  -> our param tree for `config` (model and objective filled, e.g. from
  :func:`read_pair_config`)."""
  sds = {n: checkpoint_io.read_hf_state_dict(os.path.join(path, n))[0]
         for n in NETWORKS}
  logging.info("Read ELECTRA pair from %s.", path)
  return from_hf_state_dicts(sds, config)


# --------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------
def _network_model(network: str):
  def make(model_config, rngs):
    cls = (electra_model.ElectraGeneratorModel if network == GENERATOR else
           electra_model.ElectraDiscriminatorModel)
    return cls(model_config, rngs=rngs)
  return make


def _table(network: str) -> Table:
  embeddings, layers = _bert_rows(network)
  return Table(
      name=f"electra_{network}", model_type="electra",
      rows=embeddings + _project_rows(network) + layers + HEAD_ROWS[network],
      make_model=_network_model(network), tied=TIED_HF_KEYS.get(network, {}),
      default_architecture=ARCHITECTURES[network],
      export_architecture=ARCHITECTURES[network], base_prefix="electra.",
      shape_fields={"embeddings.": "embedding_size"},
      optional=("embeddings_project",), masked_lm=network == GENERATOR,
      config_to_hf=functools.partial(_config_to_hf, network),
      config_from_hf=_config_from_hf)


TABLES = {n: _table(n) for n in NETWORKS}
DISCRIMINATOR_TABLE, GENERATOR_TABLE = TABLES[DISCRIMINATOR], TABLES[GENERATOR]


def hf_models(config, params) -> tuple[checkpoint_io.HFModel, ...]:
  """Two Hugging Face models, as Google releases them: discriminator/
  (ElectraForPreTraining) and generator/ (ElectraForMaskedLM), each with a
  copy of the shared embeddings."""
  return tuple(checkpoint_io.HFModel(
      net, TABLES[net], network_config(config, net),
      network_params(params, net)) for net in NETWORKS)


# --------------------------------------------------------------------------
# The encoder task heads sit on: the discriminator
# --------------------------------------------------------------------------
def _encoder_rows() -> tuple[Row, ...]:
  """The discriminator as ``models.bert.BertModel`` (``bert.*``) under
  ElectraModel's names: BERT's embeddings and layers, the projection."""
  out = [Row(r.ours, "electra." + r.hf[len("bert."):], "", r.transpose_hf,
             False)
         for r in bert_family.BERT.rows
         if r.ours.startswith(("bert.embeddings.", "bert.layers."))]
  out[5:5] = [
      Row("bert.embeddings_project.kernel", "electra.embeddings_project.weight", "", True, False),
      Row("bert.embeddings_project.bias", "electra.embeddings_project.bias", "", False, False)]
  return tuple(out)


def _encoder_to_hf(mc, pad_token_id: int = 0) -> dict:
  net = ml_collections.ConfigDict(mc.to_dict())
  net.embedding_size = bert_model.embedding_size(mc)
  return dict(_config_to_hf(DISCRIMINATOR, net, pad_token_id),
              architectures=["ElectraModel"])


ENCODER = bert_family.encoder_table(
    DISCRIMINATOR_TABLE, name="electra_encoder", architecture="ElectraModel",
    rows=_encoder_rows(), config_to_hf=_encoder_to_hf)


def pretrained_encoder_params(config, params) -> dict:
  """The discriminator of an ELECTRA run: the shared embeddings, its
  E -> H projection when E != H, and its layers; the pooler comes fresh."""
  del config
  enc = params["discriminator"]["encoder"]
  out = {"embeddings": params["embeddings"], "layers": enc["layers"]}
  if enc.get("embeddings_project") is not None:
    out["embeddings_project"] = enc["embeddings_project"]
  return {"bert": out}


LAYOUT = heads.HeadLayout(pooler_act="gelu")


def _one_network(model_config) -> dict:
  """A directory holding one network is half of a run: refused."""
  del model_config
  raise ValueError("is one Hugging Face ELECTRA network, half of an ELECTRA "
                   "pair: give the directory holding its discriminator/ and "
                   "generator/.")

FAMILY = Family(
    name="electra", title="ELECTRA", objectives=(electra_objective.OBJECTIVE,),
    pretraining_tables=(DISCRIMINATOR_TABLE, GENERATOR_TABLE),
    encoder_table=ENCODER, encoder_attr="bert",
    make_encoder=bert_family.make_encoder, head_layout=LAYOUT,
    pooler_rows=(
        Row("bert.pooler.kernel", "classifier.dense.weight", "", True, False),
        Row("bert.pooler.bias", "classifier.dense.bias", "", False, False)),
    transform_rows=(),
    output_hf={heads.POOLED: "classifier.out_proj"}, output_tf={},
    encoder_flops=bert_family.encoder_flops,
    validate_model=bert_model.validate_model_config,
    pretrained_encoder_config=lambda config: bert_family.encoder_config(
        config.model, LAYOUT.pooler_act),
    pretrained_encoder_params=pretrained_encoder_params,
    hf_models=hf_models, hf_run_fields=_one_network)
