"""Config checks of the input a job reads, by the objective that reads it.

Which checks apply is the job's: each objective's `validate` calls the ones
of its input (`bert_jax.objectives.Objective.validate`). Every job feeds the
model sequences of `data.seq_length` (`check_sequence`); the pretraining
objectives also read the pretraining pipeline, whose tokenizer, masking and
sentence-pair fields `check_pretraining` checks. A fine-tuning task reads
the task's rows with the checkpoint's tokenizer, so none of those apply to
it (a DistilBERT encoder has no segment table and no sentence pairs to
conflict with). Each raises ValueError with one sentence naming the field.
No TensorFlow here: this runs before anything is built or written.
"""

from __future__ import annotations

import ml_collections

from bert_jax import config_lib
from bert_jax.models import bert
from bert_jax.models import splash

# The input pipeline's limit (masking keys hold positions up to 2^13;
# ModernBERT's context extension reaches 8,192).
MAX_SEQ_LENGTH = 8192


def check_sequence(config: ml_collections.ConfigDict) -> None:
  """data.seq_length fits the model's positions, the pipeline and the
  attention kernel."""
  data, model = config.data, config.model
  offset = bert.position_offset(model)
  if data.seq_length > model.max_position_embeddings - offset:
    shift = (f" less the {offset} positions before the first token's "
             "(model.positions_from_pad: positions start at "
             f"model.pad_token_id + 1 = {offset})") if offset else ""
    raise ValueError(
        f"data.seq_length={data.seq_length} exceeds "
        f"model.max_position_embeddings={model.max_position_embeddings}"
        f"{shift}.")
  if data.seq_length > MAX_SEQ_LENGTH:
    raise ValueError(f"data.seq_length={data.seq_length} exceeds the "
                     f"pipeline's limit of {MAX_SEQ_LENGTH}.")
  if data.seq_length < 8:
    raise ValueError(f"data.seq_length={data.seq_length} is too short "
                     "(need >= 8).")
  if model.attention_impl == "splash":
    splash.check_seq_length(data.seq_length)


def check_pretraining(config: ml_collections.ConfigDict) -> None:
  """The pretraining pipeline's fields: tokenizer, sequence shape, masking,
  sentence pairs and the held-out split."""
  data, model = config.data, config.model
  if data.tokenizer_type not in config_lib.TOKENIZER_TYPES:
    raise ValueError(f"data.tokenizer_type={data.tokenizer_type!r} must be "
                     f"one of {', '.join(map(repr, config_lib.TOKENIZER_TYPES))}.")
  if not data.tokenizer_path and data.tokenizer_vocab_size < 16:
    raise ValueError(f"data.tokenizer_vocab_size={data.tokenizer_vocab_size} "
                     "is too small (need >= 16).")
  check_sequence(config)
  order = data.get("shard_order", "global")
  if order not in ("global", "files"):
    raise ValueError(f"data.shard_order={order!r} must be 'global' or "
                     "'files'.")
  if not 1 <= data.max_predictions_per_seq <= data.seq_length:
    raise ValueError(
        f"data.max_predictions_per_seq={data.max_predictions_per_seq} must be "
        f"in [1, data.seq_length={data.seq_length}].")
  if not 0.0 < data.mask_rate <= 1.0:
    raise ValueError(f"data.mask_rate={data.mask_rate} must be in (0, 1].")
  if data.get("source_temperature", 0.0) < 0:
    raise ValueError(f"data.source_temperature={data.source_temperature} "
                     "must be >= 0 (0: the sources' @W weights as given).")
  if not (0 <= data.mask_token_prob and 0 <= data.random_token_prob
          and data.mask_token_prob + data.random_token_prob <= 1.0):
    raise ValueError(
        f"data.mask_token_prob={data.mask_token_prob} and "
        f"data.random_token_prob={data.random_token_prob} must be >= 0 and "
        "sum to <= 1.")
  if not 1 <= data.max_ngram <= 16:
    raise ValueError(f"data.max_ngram={data.max_ngram} must be in [1, 16] "
                     "(1: no spans; ALBERT uses 3).")
  obj = config_lib.sentence_objective(data)
  if obj not in config_lib.SENTENCE_OBJECTIVES:
    raise ValueError(f"data.objective={data.objective!r} must be one of "
                     "'nsp', 'sop', 'packed' (or '').")
  if (obj == config_lib.PACKED) == bool(data.nsp):
    raise ValueError(f"data.objective={obj!r} conflicts with "
                     f"data.nsp={data.nsp}: 'nsp'/'sop' need nsp=True, "
                     "'packed' needs nsp=False.")
  if obj != config_lib.PACKED and model.type_vocab_size < 2:
    raise ValueError(f"data.objective={obj!r} needs model.type_vocab_size >= 2"
                     f", got {model.type_vocab_size}.")
  if data.block_lines < 2:
    raise ValueError(f"data.block_lines={data.block_lines} must be >= 2.")
  if not 0.0 <= data.eval_fraction < 1.0:
    raise ValueError(f"data.eval_fraction={data.eval_fraction} must be in "
                     "[0, 1).")
