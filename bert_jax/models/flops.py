"""Analytic training FLOPs, achieved TFLOP/s and MFU.

Training FLOPs count the matmuls only, forward plus backward (x3), as in
Kaplan et al. 2020 / the PaLM appendix:

  encoder, per token:   6 * L * (4 d^2 + 2 d d_ff)  +  12 * L * T * d
  MLM head, per position that gets vocabulary logits:  6 * (d^2 + d V)

(the 12 L T d term is QK^T and PV; embeddings, LayerNorm, softmax, GELU, the
pooler and the NSP head are left out). With factorized embeddings (width
E != d) the encoder adds the projection, 6 E d per token, and the MLM head
maps d -> E: 6 (d E + E V).

Two counts of a step, from one :class:`Work` (what the step computes on):

* **full rows** (:func:`full_rows`): every slot of the batch a real token and
  one sequence a row, T^2 query-key pairs each: what the kernels compute on
  a padded or packed batch of that shape (they run on padding and compute
  the masked pairs too). The startup log and ``train_flops_per_step``.
* **real work** (``training/steps.py`` counts it from each batch): the real
  tokens only, and attention over each sequence's own length, sum of L_i^2
  over the sequences of a row (a packed row of sequences L_1, L_2 attends
  L_1^2 + L_2^2 pairs, not (L_1 + L_2)^2), MLM logits at the real masked
  positions. The MFU the trainer logs: useful model FLOPs, so a padded and a
  packed run of the same data read the same FLOPs per example.

Each objective may count its own step (``Objective.flops(config, work)``,
built from the functions here); :func:`compose.train_flops_per_step`
uses it, else BERT's count (:func:`bert_flops`; ALBERT's too: layer sharing
saves parameters, not FLOPs). ELECTRA counts both networks
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

from typing import NamedTuple

from bert_jax.models import attention
from bert_jax.models import rope_attention


class Work(NamedTuple):
  """What a step computes on, in the units the FLOP counts need."""
  tokens: float  # Tokens every dense layer runs on.
  attended: float  # Query-key pairs of attention: sum over sequences of L^2.
  predictions: float  # Positions that get MLM vocabulary logits.


def full_rows(rows: int, seq_length: int, predictions_per_row: int) -> Work:
  """Every slot a real token, one sequence of seq_length a row."""
  return Work(tokens=float(rows * seq_length),
              attended=float(rows * seq_length ** 2),
              predictions=float(rows * predictions_per_row))


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


def dense_flops_per_token(model_config) -> float:
  """The encoder's per-token matmuls (all but attention's QK^T and PV),
  with the E -> d projection when the embeddings are factorized."""
  L = model_config.num_hidden_layers
  d = model_config.hidden_size
  f = model_config.intermediate_size
  e = _embedding_size(model_config)
  project = 6.0 * e * d if e != d else 0.0
  return 6.0 * L * (4 * d * d + 2 * d * f) + project


def encoder_flops(model_config, work: Work) -> float:
  """Training FLOPs of the encoder stack on `work`."""
  attention = 12.0 * model_config.num_hidden_layers * model_config.hidden_size
  return (work.tokens * dense_flops_per_token(model_config)
          + attention * work.attended)


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


def masked_lm_flops(model_config, work: Work) -> float:
  """An encoder and its MLM head at the predicted positions, on `work`."""
  return (encoder_flops(model_config, work)
          + work.predictions * mlm_head_flops_per_position(model_config))


def bert_flops(config, work: Work) -> float:
  """BERT's (and ALBERT's) training FLOPs on `work` (config.model)."""
  return masked_lm_flops(config.model, work)


def forward_flops(training_flops: float) -> float:
  """The forward pass alone: 2 of the 6 FLOPs per multiply-add (a frozen
  network that computes no gradient)."""
  return training_flops / 3.0


# ModernBERT (models/modernbert.py): fused Wqkv (3 d^2) and Wo (d^2), GeGLU
# Wi (2 d f) and Wo (f d) per block; attention 12 d per query-key pair the
# scores are computed for. Global layers: the work's pairs (T^2 a full row,
# sum of L_i^2 over a packed row's documents). Sliding-window layers: at
# most keys_per_query per token (3 x local_attention / 2 when the "xla"
# kind runs them blocked, attention.keys_per_query), and never more
# than the global count; the MLM head is dense d -> d plus the tied decoder
# at the predicted positions.
def modernbert_encoder_flops(model_config, work: Work,
                             seq_length: int) -> float:
  """ModernBERT's encoder stack on `work` (rows of `seq_length` slots)."""
  L = int(model_config.num_hidden_layers)
  d, f = int(model_config.hidden_size), int(model_config.intermediate_size)
  pairs = 0.0
  for i in range(L):
    window = rope_attention.window(
        model_config, rope_attention.is_global_layer(model_config, i))
    keys = attention.keys_per_query(seq_length, window,
                                    model_config.attention_impl)
    pairs += min(work.attended, work.tokens * keys)
  return work.tokens * 6.0 * L * (4 * d * d + 3 * d * f) + 12.0 * d * pairs


def modernbert_head_flops_per_position(model_config) -> float:
  d, v = int(model_config.hidden_size), int(model_config.vocab_size)
  return 6.0 * (d * d + d * v)


def modernbert_flops(config, work: Work) -> float:
  """A ModernBERT MLM step on `work`: the encoder on its tokens, the head at
  its predicted positions."""
  return (modernbert_encoder_flops(config.model, work, config.data.seq_length)
          + work.predictions * modernbert_head_flops_per_position(config.model))
