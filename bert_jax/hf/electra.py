"""Hugging Face <-> bert_jax for ELECTRA: one table per network, both ways.

The tables are registered in :mod:`bert_jax.hf.mapping` as the families
``electra_discriminator`` and ``electra_generator`` (their ``make_model``
builds the network alone, ``electra_model.Electra{Discriminator,Generator}
Model``); this module reads them to write and read the pair.

An export is one directory with two standard Hugging Face model directories:

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
Kernels are (in, out) here and (out, in) in PyTorch: rows with transpose=True.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping

import ml_collections
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from bert_jax import config_lib
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.hf.mapping import Row
from bert_jax.models import bert as model_lib
from bert_jax.models import electra as electra_model

DISCRIMINATOR, GENERATOR = "discriminator", "generator"
ARCHITECTURES = {DISCRIMINATOR: "ElectraForPreTraining",
                 GENERATOR: "ElectraForMaskedLM"}

# Rows (our path, HF name, Google TF name: not mapped, transpose to HF, -).
# "{net}" = our network ("generator" or "discriminator"), "{i}" = layer
# index. The shared rows appear in both HF models.
SHARED_ROWS = (
    Row("embeddings.word_embeddings", "electra.embeddings.word_embeddings.weight", "", False, False),
    Row("embeddings.position_embeddings", "electra.embeddings.position_embeddings.weight", "", False, False),
    Row("embeddings.token_type_embeddings", "electra.embeddings.token_type_embeddings.weight", "", False, False),
    Row("embeddings.layer_norm.scale", "electra.embeddings.LayerNorm.weight", "", False, False),
    Row("embeddings.layer_norm.bias", "electra.embeddings.LayerNorm.bias", "", False, False),
)
# Only when the network's hidden size differs from embedding_size.
PROJECT_ROWS = (
    Row("{net}.encoder.embeddings_project.kernel", "electra.embeddings_project.weight", "", True, False),
    Row("{net}.encoder.embeddings_project.bias", "electra.embeddings_project.bias", "", False, False),
)
LAYER_ROWS = (
    Row("{net}.encoder.layers.{i}.attention.query.kernel", "electra.encoder.layer.{i}.attention.self.query.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.attention.query.bias", "electra.encoder.layer.{i}.attention.self.query.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.attention.key.kernel", "electra.encoder.layer.{i}.attention.self.key.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.attention.key.bias", "electra.encoder.layer.{i}.attention.self.key.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.attention.value.kernel", "electra.encoder.layer.{i}.attention.self.value.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.attention.value.bias", "electra.encoder.layer.{i}.attention.self.value.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.attention.output.kernel", "electra.encoder.layer.{i}.attention.output.dense.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.attention.output.bias", "electra.encoder.layer.{i}.attention.output.dense.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.attention.layer_norm.scale", "electra.encoder.layer.{i}.attention.output.LayerNorm.weight", "", False, False),
    Row("{net}.encoder.layers.{i}.attention.layer_norm.bias", "electra.encoder.layer.{i}.attention.output.LayerNorm.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.feed_forward.intermediate.kernel", "electra.encoder.layer.{i}.intermediate.dense.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.feed_forward.intermediate.bias", "electra.encoder.layer.{i}.intermediate.dense.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.feed_forward.output.kernel", "electra.encoder.layer.{i}.output.dense.weight", "", True, False),
    Row("{net}.encoder.layers.{i}.feed_forward.output.bias", "electra.encoder.layer.{i}.output.dense.bias", "", False, False),
    Row("{net}.encoder.layers.{i}.feed_forward.layer_norm.scale", "electra.encoder.layer.{i}.output.LayerNorm.weight", "", False, False),
    Row("{net}.encoder.layers.{i}.feed_forward.layer_norm.bias", "electra.encoder.layer.{i}.output.LayerNorm.bias", "", False, False),
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


def network_config(config, network: str) -> ml_collections.ConfigDict:
  """Our model config of one network (the generator's is derived)."""
  if network == GENERATOR:
    return electra_model.generator_config(config)
  net = ml_collections.ConfigDict(config.model.to_dict())
  net.embedding_size = model_lib.embedding_size(config.model)
  return net


def _network_model(network: str):
  def make(model_config, rngs):
    cls = (electra_model.ElectraGeneratorModel if network == GENERATOR else
           electra_model.ElectraDiscriminatorModel)
    return cls(model_config, rngs=rngs)
  return make


def _register(network: str) -> mapping.Family:
  rows = [Row(*(f.replace("{net}", network) if isinstance(f, str) else f
                for f in r))
          for r in SHARED_ROWS + PROJECT_ROWS + LAYER_ROWS]
  return mapping.register(mapping.Family(
      name=f"electra_{network}", model_type="electra",
      rows=tuple(rows) + HEAD_ROWS[network], make_model=_network_model(network),
      tied=TIED_HF_KEYS.get(network, {}),
      default_architecture=ARCHITECTURES[network], base_prefix="electra.",
      shape_fields={"word_embeddings": "vocab_size",
                    "position_embeddings": "max_position_embeddings",
                    "token_type_embeddings": "type_vocab_size",
                    "intermediate": "intermediate_size"}))


def table(network: str, num_layers: int, projected: bool) -> list[Row]:
  """The registered rows of one network; the projection rows only when
  the network projects (hidden size != embedding_size)."""
  rows = mapping.get(f"electra_{network}").table(num_layers)
  return [r for r in rows if projected or "embeddings_project" not in r.ours]


def _table_for(config, network: str):
  net = network_config(config, network)
  return table(network, net.num_hidden_layers,
               net.embedding_size != net.hidden_size)


def to_hf_state_dicts(params: Mapping[str, Any], config
                      ) -> dict[str, dict[str, np.ndarray]]:
  """Our tree -> {"discriminator": HF state dict, "generator": ...}, fp32."""
  flat = mapping.flatten_params(params)
  out, used = {}, set()
  for network in (DISCRIMINATOR, GENERATOR):
    rows = _table_for(config, network)
    missing = [r.ours for r in rows if r.ours not in flat]
    if missing:
      raise ValueError(f"Param tree does not match the ELECTRA {network} "
                       f"table for this config: missing {missing[:5]}.")
    sd = {}
    for r in rows:
      x = mapping.f32(flat[r.ours])
      sd[r.hf] = np.ascontiguousarray(x.T) if r.transpose_hf else x
      used.add(r.ours)
    for tied, src in TIED_HF_KEYS.get(network, {}).items():
      sd[tied] = sd[src].copy()
    out[network] = sd
  extra = sorted(set(flat) - used)
  if extra:
    raise ValueError(f"Params not in the ELECTRA table: {extra[:5]}.")
  return out


def from_hf_state_dicts(state_dicts: Mapping[str, Mapping[str, Any]], config
                        ) -> dict:
  """{"discriminator": sd, "generator": sd} -> our tree (exact copies).

  Every table row must be present; the shared embeddings must be equal in
  both (a ValueError names the first that is not), tied keys equal their
  source.
  """
  flat: dict[str, np.ndarray] = {}
  for network in (DISCRIMINATOR, GENERATOR):
    sd = state_dicts[network]
    rows = _table_for(config, network)
    missing = [r.hf for r in rows if r.hf not in sd]
    if missing:
      raise ValueError(f"The {network} checkpoint lacks {missing[:5]} "
                       "(is it an ELECTRA model of this size?).")
    for r in rows:
      ours, name = r.ours, r.hf
      x = np.asarray(sd[name], np.float32)
      x = np.ascontiguousarray(x.T) if r.transpose_hf else x
      if ours in flat and not np.array_equal(flat[ours], x):
        raise ValueError(
            f"{name} differs between the discriminator and the generator "
            f"(max |diff| {np.max(np.abs(flat[ours] - x)):.3g}); ELECTRA "
            "shares the embeddings, so both must hold the same table.")
      flat[ours] = x
    for tied, src in TIED_HF_KEYS.get(network, {}).items():
      if tied in sd and not np.array_equal(np.asarray(sd[tied], np.float32),
                                           np.asarray(sd[src], np.float32)):
        raise ValueError(f"{network}: {tied} is not tied to {src}; this "
                         "model decodes with the word embeddings.")
  return mapping.unflatten_params(flat)


def hf_config(config, network: str, *, pad_token_id: int = 0) -> dict:
  """Our config -> the ElectraConfig dict (config.json) of one network."""
  net = network_config(config, network)
  cfg = {"architectures": [ARCHITECTURES[network]], "model_type": "electra"}
  for f in CONFIG_FIELDS:
    v = net[f]
    cfg[f] = v if isinstance(v, str) else (
        float(v) if isinstance(v, float) else int(v))
  cfg.update(pad_token_id=int(pad_token_id), position_embedding_type="absolute",
             tie_word_embeddings=True, dtype="float32")
  return cfg


def config_from_hf(disc_cfg: Mapping[str, Any], gen_cfg: Mapping[str, Any],
                   base=None) -> ml_collections.ConfigDict:
  """Two ElectraConfig dicts -> our config (``model`` and ``objective``).

  `base`: a config to fill (its other groups kept); default electra_small's.
  """
  for name, c in ((DISCRIMINATOR, disc_cfg), (GENERATOR, gen_cfg)):
    if c.get("model_type") != "electra":
      raise ValueError(f"{name}/config.json has model_type="
                       f"{c.get('model_type')!r}, not 'electra'.")
    if c.get("hidden_act", "gelu") != "gelu":
      raise ValueError(f"{name}/config.json hidden_act={c['hidden_act']!r}: "
                       "only exact 'gelu' is implemented.")
  for f in ("vocab_size", "embedding_size", "max_position_embeddings",
            "type_vocab_size"):
    if disc_cfg.get(f) != gen_cfg.get(f):
      raise ValueError(f"The generator's {f}={gen_cfg.get(f)} differs from "
                       f"the discriminator's {disc_cfg.get(f)}: they share "
                       "embeddings, so these must be equal.")
  if base is None:
    base = config_lib.get_config("base")
  config = ml_collections.ConfigDict(base.to_dict())
  for f in CONFIG_FIELDS:
    if f in disc_cfg:
      config.model[f] = type(config.model[f])(disc_cfg[f])
  obj = config_lib.objective_config()
  if "objective" in config and config.objective.get("name") == "electra":
    obj.update(config.objective.to_dict())
  obj.name = "electra"
  h, layers = disc_cfg["hidden_size"], disc_cfg["num_hidden_layers"]
  obj.generator_hidden_size = gen_cfg["hidden_size"] / h
  obj.generator_layers = gen_cfg["num_hidden_layers"] / layers
  obj.generator_num_attention_heads = int(gen_cfg["num_attention_heads"])
  obj.generator_intermediate_size = int(gen_cfg["intermediate_size"])
  config.objective = obj
  return config


def save_pretrained(out_dir: str, params, config, *,
                    tokenizer: tokenizer_files.TokenizerSpec | None = None,
                    source: str = "") -> list[str]:
  """Write OUT/discriminator and OUT/generator; returns the files written."""
  sds = to_hf_state_dicts(params, config)
  written = []
  for network, sd in sds.items():
    d = os.path.join(out_dir, network)
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    pad_id = 0
    if tokenizer is not None:
      tok_cfg = tokenizer_files.write_hf_tokenizer_files(
          d, tokenizer,
          model_max_length=int(config.model.max_position_embeddings))
      tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
      pad = tok.token_to_id(tok_cfg.get("pad_token", "[PAD]"))
      pad_id = 0 if pad is None else pad
      n_tok = tok.get_vocab_size(with_added_tokens=True)
      if n_tok > int(config.model.vocab_size):
        raise ValueError(f"The tokenizer has {n_tok} tokens but "
                         f"model.vocab_size={config.model.vocab_size}.")
    cfg = hf_config(config, network, pad_token_id=pad_id)
    if source:
      cfg["bert_jax_source"] = source
    with open(os.path.join(d, "config.json"), "w") as f:
      json.dump(cfg, f, indent=2)
    written += sorted(os.path.join(network, n) for n in os.listdir(d))
  return written


def read_pair_config(path: str, base=None
                     ) -> tuple[dict, ml_collections.ConfigDict]:
  """PATH/discriminator + PATH/generator config.json -> (the two HF config
  dicts, our config with ``model`` and ``objective`` filled)."""
  cfgs = {}
  for n in (DISCRIMINATOR, GENERATOR):
    d = os.path.join(path, n)
    cfg = checkpoint_io.read_hf_config(d) if os.path.isdir(d) else None
    if cfg is None:
      raise FileNotFoundError(
          f"{d}/config.json not found: an ELECTRA directory holds "
          "discriminator/ and generator/ Hugging Face model directories.")
    cfgs[n] = cfg
  return cfgs, config_from_hf(cfgs[DISCRIMINATOR], cfgs[GENERATOR], base)


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


def load_pretrained(path: str, base=None
                    ) -> tuple[dict, ml_collections.ConfigDict]:
  """An export (or a released pair: PATH/discriminator + PATH/generator)
  -> (our param tree, config with ``model`` and ``objective`` filled)."""
  _, config = read_pair_config(path, base)
  sds = {n: checkpoint_io.read_hf_state_dict(os.path.join(path, n))[0]
         for n in (DISCRIMINATOR, GENERATOR)}
  logging.info("Read ELECTRA pair from %s.", path)
  return from_hf_state_dicts(sds, config), config


DISCRIMINATOR_FAMILY = _register(DISCRIMINATOR)
GENERATOR_FAMILY = _register(GENERATOR)
