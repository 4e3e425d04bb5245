"""Sentence embeddings trained on pairs, as a fine-tuning task kind
(``task.kind="pairs"``, objective "embed"; configs/pairs.py).

The head is the embedding itself (``models.heads`` role "embed": the
encoder's tokens pooled, mean or [CLS], optionally L2-normalised) on any
family's encoder; each text is encoded on its own. Data
(``data/pair_sources``): CSV / TSV / JSONL rows of an anchor
(``task.text_field``), its positive (``task.text_pair_field``), optional
hard negatives (``task.negative_fields``) and an optional score
(``task.label_field``, within ``task.score_range``); GLUE ``stsb`` / ``mrpc``
from TFDS. The loss (``objective.pair_loss``, ``pair_losses``) is
in-batch negatives over the whole global batch (rows whose score is below
``task.positive_threshold`` are no positive pairs and are left out of its
training data) or CoSENT on the scores, summed over
``objective.matryoshka_dims`` prefixes when given. Texts are padded to
their batch's bucket, or, with ``data.packing``, packed several a row
(``pair_batches.pack``): the same vectors without computing padding.

Evaluation (``pair_scoring``): the validation pairs' cosine similarities
against their scores, as STS (Spearman, Pearson) or, for 0 / 1 labels, as
paraphrase detection at the best threshold (``task.pair_metric``), and a
BEIR directory (``task.retrieval_dir``) as exact retrieval (nDCG@10,
MRR@10, Recall@10/100, MAP@100); the predictions are each pair's
similarity and the TREC run file. Exported as the family's bare
``{Prefix}Model`` plus the sentence-transformers modules, which
``SentenceTransformer(path)`` loads.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import tasks
from bert_jax.data import beir
from bert_jax.data import features
from bert_jax.data import pair_sources
from bert_jax.hf import sentence_transformers
from bert_jax.models import heads
from bert_jax.objectives import SplitLoss
from bert_jax.objectives import safe_div
from bert_jax.tasks import pair_losses
from bert_jax.tasks import pair_scoring

INFONCE, COSENT = "infonce", "cosent"
LOSSES = (INFONCE, COSENT)
STS, BINARY = pair_scoring.STS, pair_scoring.BINARY
RETRIEVAL = pair_scoring.RETRIEVAL
_NORMALIZE = {"": None, "true": True, "false": False}


@dataclasses.dataclass(frozen=True)
class PairTask:
  """What the task is: its columns, its score, how each split is scored."""
  name: str
  columns: tuple[str, ...]  # anchor, positive, hard negatives
  score_field: str  # "" when the rows have no score
  metrics: dict  # eval split -> STS, BINARY or RETRIEVAL
  dropped: int = 0  # training rows below task.positive_threshold (InfoNCE)
  num_labels: int = 1  # (no classes: model.num_labels is unused)
  label_names: tuple = ()


def _task(config):
  return config.get("task") or {}


def columns(config) -> tuple[str, ...]:
  """The text fields of a training example: anchor, positive, negatives."""
  t = _task(config)
  return ((t.get("text_field", "sentence1") or "sentence1",
           t.get("text_pair_field", "sentence2") or "sentence2")
          + tuple(t.get("negative_fields", ()) or ()))


def texts_per_example(config) -> int:
  return len(columns(config))


# ==============================================================================
# Reading the task: every check before anything is written.
# ==============================================================================
def _split_metric(config, rows: pair_sources.PairRows, where: str) -> str:
  """STS for graded scores, BINARY for 0 / 1 labels (task.pair_metric
  forces one)."""
  chosen = _task(config).get("pair_metric", "") or ""
  if rows.scores is None:
    raise ValueError(f"{where}: validation pairs are scored by their "
                     "similarity against a score: set task.label_field.")
  binary = bool(np.all(np.isin(rows.scores, (0.0, 1.0))))
  if chosen == BINARY and not binary:
    raise ValueError(f"{where}: task.pair_metric='binary' needs 0 / 1 "
                     "labels, and some scores are not.")
  return chosen or (BINARY if binary else STS)


def read(config, label_dir: str):
  """(task, train rows, {eval split: rows or a beir.Retrieval})."""
  del label_dir  # No labels to map.
  t = config.task
  cols = columns(config)
  loss = config.objective.pair_loss
  if t.name in pair_sources.GLUE_PAIRS:
    if len(cols) > 2:
      raise ValueError(f"task.negative_fields={tuple(t.negative_fields)}: "
                       f"{t.name} has no hard negatives.")
    train = pair_sources.read_glue(t.name, "train", t.tfds_data_dir)
    evals = {"validation": pair_sources.read_glue(
        t.name, "validation", t.tfds_data_dir)}
    score_field, cols = "label", ("sentence1", "sentence2")
  else:
    if not t.train_file:
      raise ValueError(f"task.name={t.name!r} reads your files: set "
                       "task.train_file (CSV, TSV or JSONL pairs).")
    score_field = t.label_field
    if loss == COSENT and not score_field:
      raise ValueError("objective.pair_loss='cosent' learns from scored "
                       "pairs: set task.label_field to the score column.")
    kw = dict(score_range=tuple(t.get("score_range", ()) or ()))
    train = pair_sources.read_file(t.train_file, cols, score_field, **kw)
    evals = {}
    if t.validation_file:
      evals["validation"] = pair_sources.read_file(
          t.validation_file, cols[:2], score_field, **kw)
  metrics = {s: _split_metric(config, r, f"task.{s}_file")
             for s, r in evals.items()}
  if t.get("retrieval_dir", ""):
    evals[RETRIEVAL] = beir.read(t.retrieval_dir, t.retrieval_split)
    metrics[RETRIEVAL] = RETRIEVAL
  if not evals:
    raise ValueError("Nothing to score the sentence space on: set "
                     "task.validation_file (scored pairs) and / or "
                     "task.retrieval_dir (a BEIR directory).")
  dropped = 0
  if loss == INFONCE and train.scores is not None:
    keep = train.scores >= float(t.positive_threshold)
    dropped = int(np.sum(~keep))
    train = train.select(keep)
    if not len(train):
      raise ValueError(f"task.train_file: no row has {score_field} >= "
                       f"task.positive_threshold={t.positive_threshold}: no "
                       "positive pair to train on.")
  return PairTask(t.name, cols, score_field, metrics, dropped), train, evals


def save(workdir: str, task) -> None:
  del workdir, task  # Nothing beyond task.json.


# ==============================================================================
# The head's loss and metrics (objectives.Objective pieces).
# ==============================================================================
def feature_spec(config):
  k = texts_per_example(config)
  if config.data.get("packing", False):
    return features.packed_pair_spec(k)
  return features.pair_spec(k)


def embed(model, batch, rng, deterministic: bool, config):
  """Vectors [B, K, d] of the batch's texts, each encoded alone: from
  padded texts [B, K, L], or from packed rows (``slots`` [B, K] picks each
  text's vector among the rows' [B, S])."""
  del config
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  if "slots" in batch:
    out = model(batch["input_ids"], batch["input_mask"],
                batch["segment_ids"], deterministic=deterministic, rngs=rngs,
                **features.packed_inputs(batch))
    b, s, d = out.shape
    return jnp.take(out.reshape(b * s, d), jnp.maximum(batch["slots"], 0),
                    axis=0)
  b, k, length = batch["input_ids"].shape
  flat = lambda name: batch[name].reshape(b * k, length)
  out = model(flat("input_ids"), flat("input_mask"), flat("segment_ids"),
              deterministic=deterministic, rngs=rngs)
  return out.reshape(b, k, -1)


def sums_from(vectors, batch, config) -> dict:
  """loss_sums given the vectors: the loss and the count it is averaged
  over (real anchors for InfoNCE, batches holding a pair for CoSENT)."""
  o = config.objective
  w = batch["example_weights"]
  if o.pair_loss == COSENT:
    loss = pair_losses.matryoshka(
        lambda v: pair_losses.cosent(v, w, batch["scores"],
                                     scale=float(o.pair_scale)),
        vectors, tuple(o.matryoshka_dims))
    return dict(loss=loss, count=jnp.any(w > 0).astype(jnp.float32))
  loss, count = pair_losses.matryoshka(
      lambda v: pair_losses.info_nce(v, w, batch["text_ids"],
                                     scale=float(o.pair_scale),
                                     symmetric=bool(o.pair_symmetric)),
      vectors, tuple(o.matryoshka_dims))
  return dict(loss=loss, count=count)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  return sums_from(embed(model, batch, rng, deterministic, config), batch,
                   config)


def counts(batch, config) -> dict:
  w = batch["example_weights"]
  if config.objective.pair_loss == COSENT:
    return dict(count=jnp.any(w > 0).astype(jnp.float32))
  return dict(count=jnp.sum((w > 0).astype(jnp.float32)))


def loss(sums, counts_, config):
  del config
  return safe_div(sums["loss"], counts_["count"])


def metrics(sums, counts_, config) -> dict:
  return dict(loss=loss(sums, counts_, config))


def predict(model, batch, config) -> dict:
  """Every slot's vector [B, K, d], no dropout."""
  return dict(embeddings=embed(model, batch, None, True, config))


def validate(config) -> None:
  """The run's checks, the loss's and the head's."""
  tasks.check_task_run(config)
  o = config.objective
  if o.pair_loss not in LOSSES:
    raise ValueError(f"objective.pair_loss={o.pair_loss!r} must be one of "
                     f"{LOSSES}.")
  if not float(o.pair_scale) > 0:
    raise ValueError(f"objective.pair_scale={o.pair_scale} must be > 0.")
  hidden = int(config.model.hidden_size)
  dims = tuple(o.matryoshka_dims)
  if any(not 0 < int(d) <= hidden for d in dims) or len(set(dims)) != len(
      dims):
    raise ValueError(f"objective.matryoshka_dims={dims} must be distinct "
                     f"sizes between 1 and model.hidden_size={hidden}.")
  if int(config.train.grad_accum_steps) != 1:
    raise ValueError(
        f"train.grad_accum_steps={config.train.grad_accum_steps}: a "
        "contrastive loss needs the whole batch in one step (its negatives "
        "are the other examples); use train.cache_chunk_size for batches "
        "larger than fit.")
  t = _task(config)
  _check_packing(config)
  if o.pair_loss == COSENT and len(columns(config)) != 2:
    raise ValueError(f"task.negative_fields={tuple(t.negative_fields)}: "
                     "CoSENT scores pairs; hard negatives need "
                     "objective.pair_loss='infonce'.")
  pooling = t.get("pooling", "") or ""
  if pooling not in ("",) + heads.POOLINGS:
    raise ValueError(f"task.pooling={pooling!r} must be one of "
                     f"{heads.POOLINGS} or '' (the checkpoint's own, else "
                     "mean).")
  if str(t.get("normalize", "")) not in _NORMALIZE:
    raise ValueError(f"task.normalize={t.get('normalize')!r} must be "
                     "'true', 'false' or '' (the checkpoint's own).")
  metric = t.get("pair_metric", "") or ""
  if metric not in ("", STS, BINARY):
    raise ValueError(f"task.pair_metric={metric!r} must be {STS!r}, "
                     f"{BINARY!r} or '' (from the labels).")


def _check_packing(config) -> None:
  """Packed rows hold an example's K texts: data.packing_max_sequences >=
  K."""
  data = config.data
  if not data.get("packing", False):
    return
  k, s = texts_per_example(config), int(data.packing_max_sequences)
  if s < k:
    raise ValueError(f"data.packing_max_sequences={s} must be >= the {k} "
                     "texts of a training example (anchor, positive, "
                     "negatives).")


def head_fields(config, model_config) -> dict:
  """The pooling and normalisation: the task's, else the checkpoint's own
  (a sentence-transformers model's, an embedding run's), else mean and
  none."""
  t = _task(config)
  normalize = _NORMALIZE[str(t.get("normalize", ""))]
  return dict(
      embedding_pooling=(t.get("pooling", "") or
                         model_config.get("embedding_pooling", "") or "mean"),
      embedding_normalize=bool(model_config.get("embedding_normalize", False)
                               if normalize is None else normalize))


def export_files(directory: str, config) -> list[str]:
  """The sentence-transformers modules beside the exported encoder."""
  mc = config.model
  return sentence_transformers.write(
      directory, dimension=int(mc.hidden_size),
      modules=sentence_transformers.Modules(
          pooling=mc.embedding_pooling or "mean",
          normalize=bool(mc.embedding_normalize),
          max_seq_length=int(config.data.seq_length)))


KIND = tasks.Kind(
    name="pairs", objective="embed", role=heads.EMBED, output_name="",
    outputs=lambda mc: int(mc.hidden_size), hf_suffix="Model",
    outputs_are_labels=False, config_fields=lambda mc, label_names=(): {},
    feature_spec=feature_spec, loss_sums=loss_sums, counts=counts, loss=loss,
    metrics=metrics, predict=predict, log_keys=(("loss", "loss"),),
    validate=validate, packing=True, read=read, save=save,
    make_input=pair_scoring.Input, make_scorer=pair_scoring.Scorer,
    main_score=pair_scoring.main_score, head_fields=head_fields,
    export_files=export_files, split=SplitLoss(embed=embed, sums=sums_from))
