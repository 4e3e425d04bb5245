"""ModernBERT pretraining: masked LM alone (no sentence-pair head).

The model is ``models.modernbert.ModernBertForMaskedLM``; the loss is BERT's
MLM sum over the gathered masked positions / their global count
(``objectives.bert.mlm_sums``). The published recipe (Warner et al. 2024;
``published_config``): 30% masking, StableAdamW, warmup-stable-decay, 1,024
tokens with RoPE base 10,000 on every layer, then a context extension to
8,192 with the global layers' base raised to 160,000 (``train.phases`` with
a "model" entry; Hugging Face's ModernBertConfig holds the extended
model's values).
Fine-tuning puts any task kind's head on this run's encoder and prediction
head, as Hugging Face does from a ModernBertForMaskedLM
(``families/modernbert.py``).
"""

from __future__ import annotations

from flax import nnx

from bert_jax import config_lib
from bert_jax.data import checks as data_checks
from bert_jax.data import features
from bert_jax.models import flops as flops_lib
from bert_jax.models import modernbert
from bert_jax.objectives import Objective
from bert_jax.objectives import bert
from bert_jax.objectives import check_packed_input

# Hugging Face ModernBertConfig's sizes (answerdotai/ModernBERT-base, -large).
SIZES = {"base": dict(hidden_size=768, num_hidden_layers=22,
                      num_attention_heads=12, intermediate_size=1152),
         "large": dict(hidden_size=1024, num_hidden_layers=28,
                       num_attention_heads=16, intermediate_size=2624)}
MASK_RATE = 0.3  # ModernBERT masks 30% of the tokens.
# Global RoPE base at 1,024 tokens and after the extension to 8,192.
PRETRAIN_THETA, EXTENDED_THETA = 10_000.0, 160_000.0


def context_extension_phases(pretrain_steps: int, extension_steps: int,
                             batch_size: int, extension_batch_size: int):
  """train.phases of the recipe: 1,024 tokens, then 8,192 with the global
  RoPE base 160,000 (30% of the tokens predicted in both)."""
  return ({"num_steps": pretrain_steps, "seq_length": 1024,
           "max_predictions_per_seq": 308, "batch_size": batch_size},
          {"num_steps": extension_steps, "seq_length": 8192,
           "max_predictions_per_seq": 2458,
           "batch_size": extension_batch_size,
           "model": {"global_rope_theta": EXTENDED_THETA}})


def published_config(size: str):
  """The ModernBERT recipe at one size (configs/modernbert_*.py)."""
  config = config_lib.get_config("base")
  config.objective.name = "modernbert"
  config.model.update(
      vocab_size=50368, type_vocab_size=0, hidden_act="gelu",
      max_position_embeddings=8192, layer_norm_eps=1e-5,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      classifier_dropout_prob=0.0, local_attention=128,
      global_attn_every_n_layers=3, global_rope_theta=PRETRAIN_THETA,
      local_rope_theta=10_000.0, **SIZES[size])
  config.data.update(seq_length=1024, max_predictions_per_seq=308,
                     mask_rate=MASK_RATE, nsp=False, objective="packed")
  # optimi StableAdamW with "decoupled" weight decay 1e-5 (x lr / peak):
  # in AdamW's convention (x lr) that is 1e-5 / peak lr.
  peak = 8e-4 if size == "base" else 5e-4
  config.train.update(optimizer="stable_adamw", learning_rate=peak,
                      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-6,
                      weight_decay=1e-5 / peak, schedule="wsd")
  return config


def make_model(config, rngs):
  return modernbert.ModernBertForMaskedLM(config.model, rngs=rngs)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  """Packed rows (data.packing) add their sequence and position ids: each
  document attends only to itself, RoPE positions restart per document."""
  del config
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  out = model(batch["input_ids"], batch["input_mask"], None,
              batch["masked_lm_positions"], deterministic=deterministic,
              rngs=rngs, **features.packed_inputs(batch))
  return bert.mlm_sums(out["mlm_logits"], batch)


def validate(config) -> None:
  """The pretraining pipeline's checks; no sentence-pair head: NSP / SOP
  batches are refused."""
  modernbert.validate_model_config(config.model)
  check_packed_input(config, "ModernBERT")  # First: the cause, not a symptom.
  data_checks.check_pretraining(config)


OBJECTIVE = Objective(
    name="modernbert", make_model=make_model, feature_spec=bert.feature_spec,
    loss_sums=loss_sums, counts=bert.mlm_counts, loss=bert.mlm_loss,
    metrics=bert.mlm_metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy")),
    flops=flops_lib.modernbert_flops, validate=validate, packing=True)
