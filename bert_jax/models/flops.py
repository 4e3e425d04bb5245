"""Analytic training FLOPs, achieved TFLOP/s and MFU.

Training FLOPs count the matmuls only, forward plus backward (x3), as in
Kaplan et al. 2020 / the PaLM appendix:

  encoder, per token:   6 * L * (4 d^2 + 2 d d_ff)  +  12 * L * T * d
  MLM head, per position that gets vocabulary logits:  6 * (d^2 + d V)

(the 12 L T d term is QK^T and PV; embeddings, LayerNorm, softmax, GELU, the
pooler and the NSP head are left out). With factorized embeddings (width
E != d) the encoder adds the projection, 6 E d per token, and the MLM head
maps d -> E: 6 (d E + E V).

Each objective may count its own step (``Objective.flops``, FLOPs of one
sequence, built from the functions here); :func:`train_flops_per_step` uses
it, else BERT's count (:func:`bert_flops_per_sequence`; ALBERT's too: layer
sharing saves parameters, not FLOPs). ELECTRA counts both networks
(``objectives/electra.py``), DistilBERT the student's training plus the
frozen teacher's forward pass (``objectives/distil.py``). bert_jax gathers the
``max_predictions_per_seq`` masked positions before the MLM head, so P
positions per sequence get logits; a model that computes logits everywhere
(Hugging Face ``FlaxBertForPreTraining``) does T of them and spends more FLOPs
for the same useful work. MFU here is always *model* FLOPs of our model: the
same number for any implementation of the same training step.

Peak: known accelerators from a table (dense bf16; fp32 matmuls on TPU run
as bf16 passes at default precision, on GPU as TF32), a configured value
(``train.peak_tflops``), or on CPU a measured jitted 2048^3 matmul in the
compute dtype (bf16 inputs with float32 accumulation, like ``model.matmul``).
"""

from __future__ import annotations

from bert_jax.models import rope_attention


def _embedding_size(model_config) -> int:
  return int(model_config.get("embedding_size", 0) or model_config.hidden_size)


def encoder_flops_per_token(model_config, seq_length: int) -> float:
  """Training FLOPs of the encoder stack per token (forward + backward),
  with the E -> d embedding projection when the embeddings are factorized."""
  L = model_config.num_hidden_layers
  d = model_config.hidden_size
  f = model_config.intermediate_size
  e = _embedding_size(model_config)
  project = 6.0 * e * d if e != d else 0.0
  return 6.0 * L * (4 * d * d + 2 * d * f) + 12.0 * L * seq_length * d + project


def mlm_head_flops_per_position(model_config) -> float:
  """Training FLOPs of the MLM head (transform d -> E + tied decoder)."""
  d, v = model_config.hidden_size, model_config.vocab_size
  e = _embedding_size(model_config)
  return 6.0 * (d * e + e * v)


def train_flops_per_sequence(model_config, seq_length: int,
                             logit_positions: int) -> float:
  """Training FLOPs for one sequence with `logit_positions` MLM positions."""
  return (seq_length * encoder_flops_per_token(model_config, seq_length)
          + logit_positions * mlm_head_flops_per_position(model_config))


def train_flops_per_token(model_config, seq_length: int,
                          logit_positions: int) -> float:
  return train_flops_per_sequence(model_config, seq_length,
                                  logit_positions) / seq_length


def bert_flops_per_sequence(config) -> float:
  """BERT's step per sequence: config.model on every token, MLM logits at
  the max_predictions_per_seq gathered positions (the default count)."""
  return train_flops_per_sequence(config.model, config.data.seq_length,
                                  config.data.max_predictions_per_seq)


def forward_flops(training_flops: float) -> float:
  """The forward pass alone: 2 of the 6 FLOPs per multiply-add (a frozen
  network that computes no gradient)."""
  return training_flops / 3.0


# ModernBERT (models/modernbert.py): fused Wqkv (3 d^2) and Wo (d^2), GeGLU
# Wi (2 d f) and Wo (f d) per block; attention 12 d x the keys each query's
# scores are computed for (T on global layers; on sliding-window layers
# 3 x local_attention / 2 when the "xla" kind runs them blocked:
# rope_attention.keys_per_query); the MLM head is dense d -> d plus the tied
# decoder at the gathered positions.
def modernbert_encoder_flops_per_token(model_config, seq_length: int) -> float:
  L = int(model_config.num_hidden_layers)
  d, f = int(model_config.hidden_size), int(model_config.intermediate_size)
  span = sum(
      rope_attention.keys_per_query(
          seq_length, rope_attention.half_window(
              model_config, rope_attention.is_global_layer(model_config, i)),
          model_config.attention_impl)
      for i in range(L))
  return 6.0 * L * (4 * d * d + 3 * d * f) + 12.0 * d * span


def modernbert_head_flops_per_position(model_config) -> float:
  d, v = int(model_config.hidden_size), int(model_config.vocab_size)
  return 6.0 * (d * d + d * v)


def modernbert_flops_per_sequence(config) -> float:
  """A ModernBERT MLM step per sequence: the encoder on every token, the
  head at max_predictions_per_seq gathered positions."""
  t, p = config.data.seq_length, config.data.max_predictions_per_seq
  return (t * modernbert_encoder_flops_per_token(config.model, t)
          + p * modernbert_head_flops_per_position(config.model))
