"""Hugging Face <-> bert_jax for ELECTRA: one table per network, both ways.

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

from bert_jax import hf
from bert_jax import model as model_lib

DISCRIMINATOR, GENERATOR = "discriminator", "generator"
ARCHITECTURES = {DISCRIMINATOR: "ElectraForPreTraining",
                 GENERATOR: "ElectraForMaskedLM"}

# (our path, HF name, transpose). "{net}" = our network ("generator" or
# "discriminator"), "{i}" = layer index. The shared rows appear in both HF
# models.
SHARED_ROWS = (
    ("embeddings.word_embeddings", "electra.embeddings.word_embeddings.weight", False),
    ("embeddings.position_embeddings", "electra.embeddings.position_embeddings.weight", False),
    ("embeddings.token_type_embeddings", "electra.embeddings.token_type_embeddings.weight", False),
    ("embeddings.layer_norm.scale", "electra.embeddings.LayerNorm.weight", False),
    ("embeddings.layer_norm.bias", "electra.embeddings.LayerNorm.bias", False),
)
# Only when the network's hidden size differs from embedding_size.
PROJECT_ROWS = (
    ("{net}.encoder.embeddings_project.kernel", "electra.embeddings_project.weight", True),
    ("{net}.encoder.embeddings_project.bias", "electra.embeddings_project.bias", False),
)
LAYER_ROWS = (
    ("{net}.encoder.layers.{i}.attention.query.kernel", "electra.encoder.layer.{i}.attention.self.query.weight", True),
    ("{net}.encoder.layers.{i}.attention.query.bias", "electra.encoder.layer.{i}.attention.self.query.bias", False),
    ("{net}.encoder.layers.{i}.attention.key.kernel", "electra.encoder.layer.{i}.attention.self.key.weight", True),
    ("{net}.encoder.layers.{i}.attention.key.bias", "electra.encoder.layer.{i}.attention.self.key.bias", False),
    ("{net}.encoder.layers.{i}.attention.value.kernel", "electra.encoder.layer.{i}.attention.self.value.weight", True),
    ("{net}.encoder.layers.{i}.attention.value.bias", "electra.encoder.layer.{i}.attention.self.value.bias", False),
    ("{net}.encoder.layers.{i}.attention.output.kernel", "electra.encoder.layer.{i}.attention.output.dense.weight", True),
    ("{net}.encoder.layers.{i}.attention.output.bias", "electra.encoder.layer.{i}.attention.output.dense.bias", False),
    ("{net}.encoder.layers.{i}.attention.layer_norm.scale", "electra.encoder.layer.{i}.attention.output.LayerNorm.weight", False),
    ("{net}.encoder.layers.{i}.attention.layer_norm.bias", "electra.encoder.layer.{i}.attention.output.LayerNorm.bias", False),
    ("{net}.encoder.layers.{i}.feed_forward.intermediate.kernel", "electra.encoder.layer.{i}.intermediate.dense.weight", True),
    ("{net}.encoder.layers.{i}.feed_forward.intermediate.bias", "electra.encoder.layer.{i}.intermediate.dense.bias", False),
    ("{net}.encoder.layers.{i}.feed_forward.output.kernel", "electra.encoder.layer.{i}.output.dense.weight", True),
    ("{net}.encoder.layers.{i}.feed_forward.output.bias", "electra.encoder.layer.{i}.output.dense.bias", False),
    ("{net}.encoder.layers.{i}.feed_forward.layer_norm.scale", "electra.encoder.layer.{i}.output.LayerNorm.weight", False),
    ("{net}.encoder.layers.{i}.feed_forward.layer_norm.bias", "electra.encoder.layer.{i}.output.LayerNorm.bias", False),
)
HEAD_ROWS = {
    DISCRIMINATOR: (
        ("discriminator.head.dense.kernel", "discriminator_predictions.dense.weight", True),
        ("discriminator.head.dense.bias", "discriminator_predictions.dense.bias", False),
        ("discriminator.head.dense_prediction.kernel", "discriminator_predictions.dense_prediction.weight", True),
        ("discriminator.head.dense_prediction.bias", "discriminator_predictions.dense_prediction.bias", False),
    ),
    GENERATOR: (
        ("generator.mlm_head.transform.kernel", "generator_predictions.dense.weight", True),
        ("generator.mlm_head.transform.bias", "generator_predictions.dense.bias", False),
        ("generator.mlm_head.layer_norm.scale", "generator_predictions.LayerNorm.weight", False),
        ("generator.mlm_head.layer_norm.bias", "generator_predictions.LayerNorm.bias", False),
        ("generator.mlm_head.bias", "generator_lm_head.bias", False),
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
  from bert_jax import electra_model
  if network == GENERATOR:
    return electra_model.generator_config(config)
  net = ml_collections.ConfigDict(config.model.to_dict())
  net.embedding_size = model_lib.embedding_size(config.model)
  return net


def table(network: str, num_layers: int, projected: bool
          ) -> list[tuple[str, str, bool]]:
  """Rows (our dotted path, HF name, transpose) of one network."""
  rows = list(SHARED_ROWS)
  if projected:
    rows += [(o.format(net=network), h, t) for o, h, t in PROJECT_ROWS]
  for i in range(num_layers):
    rows += [(o.format(net=network, i=i), h.format(i=i), t)
             for o, h, t in LAYER_ROWS]
  return rows + list(HEAD_ROWS[network])


def _table_for(config, network: str):
  net = network_config(config, network)
  return table(network, net.num_hidden_layers,
               net.embedding_size != net.hidden_size)


def to_hf_state_dicts(params: Mapping[str, Any], config
                      ) -> dict[str, dict[str, np.ndarray]]:
  """Our tree -> {"discriminator": HF state dict, "generator": ...}, fp32."""
  flat = hf.flatten_params(params)
  out, used = {}, set()
  for network in (DISCRIMINATOR, GENERATOR):
    rows = _table_for(config, network)
    missing = [o for o, _, _ in rows if o not in flat]
    if missing:
      raise ValueError(f"Param tree does not match the ELECTRA {network} "
                       f"table for this config: missing {missing[:5]}.")
    sd = {}
    for ours, name, transpose in rows:
      x = hf._f32(flat[ours])  # pylint: disable=protected-access
      sd[name] = np.ascontiguousarray(x.T) if transpose else x
      used.add(ours)
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
    missing = [h for _, h, _ in rows if h not in sd]
    if missing:
      raise ValueError(f"The {network} checkpoint lacks {missing[:5]} "
                       "(is it an ELECTRA model of this size?).")
    for ours, name, transpose in rows:
      x = np.asarray(sd[name], np.float32)
      x = np.ascontiguousarray(x.T) if transpose else x
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
  return hf.unflatten_params(flat)


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
  from bert_jax.objectives import electra
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
    from bert_jax import config_lib
    base = config_lib.get_config("base")
  config = ml_collections.ConfigDict(base.to_dict())
  for f in CONFIG_FIELDS:
    if f in disc_cfg:
      config.model[f] = type(config.model[f])(disc_cfg[f])
  obj = electra.objective_config()
  if "objective" in config and config.objective.get("name") == "electra":
    obj.update(config.objective.to_dict())
  h, layers = disc_cfg["hidden_size"], disc_cfg["num_hidden_layers"]
  obj.generator_hidden_size = gen_cfg["hidden_size"] / h
  obj.generator_layers = gen_cfg["num_hidden_layers"] / layers
  obj.generator_num_attention_heads = int(gen_cfg["num_attention_heads"])
  obj.generator_intermediate_size = int(gen_cfg["intermediate_size"])
  config.objective = obj
  return config


def save_pretrained(out_dir: str, params, config, *,
                    tokenizer: hf.TokenizerSpec | None = None,
                    source: str = "") -> list[str]:
  """Write OUT/discriminator and OUT/generator; returns the files written."""
  from safetensors.numpy import save_file
  sds = to_hf_state_dicts(params, config)
  written = []
  for network, sd in sds.items():
    d = os.path.join(out_dir, network)
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    pad_id = 0
    if tokenizer is not None:
      tok_cfg = hf.write_hf_tokenizer_files(
          d, tokenizer,
          model_max_length=int(config.model.max_position_embeddings))
      from tokenizers import Tokenizer
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


def load_pretrained(path: str, base=None) -> tuple[dict, ml_collections.ConfigDict]:
  """An export (or a released pair: PATH/discriminator + PATH/generator)
  -> (our param tree, config with ``model`` and ``objective`` filled)."""
  dirs = {n: os.path.join(path, n) for n in (DISCRIMINATOR, GENERATOR)}
  cfgs = {}
  for n, d in dirs.items():
    cfg = hf.read_hf_config(d) if os.path.isdir(d) else None
    if cfg is None:
      raise FileNotFoundError(
          f"{d}/config.json not found: an ELECTRA directory holds "
          "discriminator/ and generator/ Hugging Face model directories.")
    cfgs[n] = cfg
  config = config_from_hf(cfgs[DISCRIMINATOR], cfgs[GENERATOR], base)
  sds = {n: hf.read_hf_state_dict(d)[0] for n, d in dirs.items()}
  logging.info("Read ELECTRA pair from %s.", path)
  return from_hf_state_dicts(sds, config), config
