"""Family x task kind, composed: what any run config trains and exports.

A run config names a pretraining objective (``objective.name``: "bert",
"electra", ...; its family is the one that declares it) or a fine-tuning
task kind's objective ("classify", "token_classify", "span_qa") on a
family's encoder (``objective.encoder``). From those two names this module
derives, for any pair and with nothing listed per pair:

  objective(config)       the Objective the trainer runs (a kind's head on
                          the family's encoder: ``models.heads.TaskModel``)
  task_table(family, kind)  the Hugging Face table of that model, named
                          ``{Prefix}{suffix}`` (BertForTokenClassification,
                          ModernBertForQuestionAnswering, ...)
  hf_models(config, params)  what an export of the run writes
  encoder_config / encoder_params  the encoder a run holds, for a new task
                          head or for embeddings
  embedding_table(family)  the family's encoder with the embedding head
  hf_directory(config.json[, sentence-transformers modules])  the table
                          that reads a Hugging Face directory and the run
                          it implies
"""

from __future__ import annotations

import dataclasses
import functools

from flax import nnx

from bert_jax import config_lib
from bert_jax import families
from bert_jax import tasks
from bert_jax.families import Family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.hf.mapping import Row
from bert_jax.models import flops as flops_lib
from bert_jax.models import heads
from bert_jax.objectives import Objective
from bert_jax.tasks import Kind


# ------------------------------------------------------------------------------
# What a config names.
# ------------------------------------------------------------------------------
def kind(config) -> Kind | None:
  """The task kind of a fine-tuning run; None for pretraining."""
  return tasks.by_objective(config.objective.name)


def family(config) -> Family:
  """The family whose encoder a run trains: a task run's
  ``objective.encoder``, else the family of its pretraining objective."""
  if kind(config) is not None:
    return families.get(config.objective.encoder)
  return families.of_objective(config.objective.name)


def objective_names() -> tuple[str, ...]:
  """Every ``objective.name`` a config may give."""
  return tuple(families.pretraining_objectives()) + tuple(
      k.objective for k in tasks.all_kinds().values())


def packing_objective_names() -> list[str]:
  """The objective names whose runs read packed rows (data.packing)."""
  return ([n for n, f in families.pretraining_objectives().items()
           if f.objective(n).packing] +
          [k.objective for k in tasks.all_kinds().values() if k.packing])


def objective(config) -> Objective:
  """The Objective the trainer runs for `config` (ValueError naming
  objective.name / objective.encoder when they name nothing)."""
  k = kind(config)
  if k is None:
    name = config.objective.name
    if name not in families.pretraining_objectives():
      raise ValueError(f"objective.name={name!r} is not one of "
                       f"{', '.join(map(repr, objective_names()))}.")
    return families.of_objective(name).objective(name)
  encoder = config.objective.encoder
  if encoder not in families.names():
    raise ValueError(f"objective.encoder={encoder!r} is not one of "
                     f"{', '.join(map(repr, families.names()))}.")
  return task_objective(k.name, encoder)


# ------------------------------------------------------------------------------
# A kind's head on a family's encoder.
# ------------------------------------------------------------------------------
def task_model(fam: Family, k: Kind, model_config, rngs):
  """The nnx model of `k`'s head on `fam`'s encoder."""
  return heads.TaskModel(
      model_config, encoder_attr=fam.encoder_attr,
      make_encoder=fam.make_encoder, layout=fam.head_layout, role=k.role,
      outputs=k.outputs(model_config), output_name=k.output_name, rngs=rngs)


@functools.lru_cache(maxsize=None)
def task_objective(kind_name: str, family_name: str) -> Objective:
  """Kind `kind_name`'s head on family `family_name`'s encoder: the kind's
  features, loss and metrics; the family's checks of the encoder; FLOPs of
  the encoder plus the head on every token for per-token kinds (a pooled
  or embedding head runs on one vector per example: not counted). The
  count is the model's: a pooler's head computes the encoder's last layer
  at [CLS] alone (``BertModel``'s pooled_only), which it still counts."""
  k, fam = tasks.get(kind_name), families.get(family_name)
  layout = fam.head_layout

  def flops(config, work: flops_lib.Work) -> float:
    mc = config.model
    total = fam.encoder_flops(mc, work, config.data.seq_length)
    if k.role in (heads.TOKEN, heads.SPAN):
      total += work.tokens * (layout.transform_flops(mc) + 6.0 * int(
          mc.hidden_size) * k.outputs(mc))
    return total

  def validate(config) -> None:
    fam.validate_model(config.model)
    k.validate(config)

  return Objective(
      name=k.objective,
      make_model=lambda config, rngs: task_model(fam, k, config.model, rngs),
      feature_spec=k.feature_spec, loss_sums=k.loss_sums, counts=k.counts,
      loss=k.loss, metrics=k.metrics, flops=flops, validate=validate,
      log_keys=k.log_keys, packing=k.packing, predict=k.predict,
      split=k.split)


def _prefix(names) -> str:
  """The longest dotted prefix shared by `names`."""
  parts = [n.split(".") for n in names]
  out = []
  for column in zip(*parts):
    if len(set(column)) != 1:
      break
    out.append(column[0])
  return ".".join(out)


def _task_config_from_hf(fam: Family, hf_config) -> object:
  """config.json of a task class -> our model config: the encoder's, the
  outputs (num_labels, or as many as id2label names) and the family's
  pooler activation."""
  mc = fam.encoder_table.config_from_hf(hf_config)
  labels = hf_config.get("num_labels") or len(hf_config.get("id2label") or {})
  if labels:
    mc.num_labels = int(labels)
  if fam.head_layout.pooler_act is not None:
    mc.pooler_act = fam.head_layout.pooler_act
  return mc


@functools.lru_cache(maxsize=None)
def task_table(family_name: str, kind_name: str) -> mapping.Table:
  """The Hugging Face table of kind `kind_name`'s head on family
  `family_name`'s encoder: the encoder's rows, the head params the
  family's layout adds (pooler, transform) and the kind's output, under
  the names of ``{Prefix}{suffix}``; config.json is the encoder's with
  that class and the kind's fields."""
  fam, k = families.get(family_name), tasks.get(kind_name)
  enc, layout = fam.encoder_table, fam.head_layout
  if k.role == heads.EMBED:  # No head params: the bare encoder's table.
    return dataclasses.replace(
        enc, name=f"{fam.name}_{k.name}", config_fields=k.config_fields,
        make_model=lambda mc, rngs: task_model(fam, k, mc, rngs))
  rows, head_names = list(enc.rows), {}
  if k.role == heads.POOLED and layout.pooler_act is not None:
    rows += fam.pooler_rows
    head_names[_prefix(r.ours for r in fam.pooler_rows)] = _prefix(
        r.hf for r in fam.pooler_rows)
  if layout.transform is not None:
    rows += fam.transform_rows
    head_names[_prefix(r.ours for r in fam.transform_rows)] = _prefix(
        r.hf for r in fam.transform_rows)
  out = k.output_name
  out_hf = fam.output_hf.get(k.role, out)
  tf_kernel, tf_bias = fam.output_tf.get(k.role, ("", ""))
  rows += [Row(f"{out}.kernel", f"{out_hf}.weight", tf_kernel, True,
               bool(tf_kernel)),
           Row(f"{out}.bias", f"{out_hf}.bias", tf_bias, False, False)]
  head_names[out] = out_hf
  cls = fam.class_prefix + k.hf_suffix
  shape_fields = dict(enc.shape_fields)
  if k.outputs_are_labels:
    shape_fields[out] = "num_labels"
  return dataclasses.replace(
      enc, name=f"{fam.name}_{k.name}", rows=tuple(rows),
      make_model=lambda mc, rngs: task_model(fam, k, mc, rngs),
      heads=head_names, architectures=((out_hf + ".", cls),),
      default_architecture=enc.export_architecture,
      export_architecture=cls, shape_fields=shape_fields,
      config_fields=k.config_fields,
      config_to_hf=lambda mc, pad_token_id=0: dict(
          enc.config_to_hf(mc, pad_token_id), architectures=[cls]),
      config_from_hf=functools.partial(_task_config_from_hf, fam))


def _embedding_kind() -> Kind:
  return next(k for k in tasks.all_kinds().values() if k.role == heads.EMBED)


def embedding_table(family_name: str) -> mapping.Table:
  """The table of the embedding head (the kind whose head role is
  ``heads.EMBED``) on family `family_name`'s encoder: the bare encoder's
  tree and class; its model returns sentence vectors pooled as the model
  config says."""
  return task_table(family_name, _embedding_kind().name)


# ------------------------------------------------------------------------------
# What a run holds.
# ------------------------------------------------------------------------------
def hf_models(config, params) -> tuple[checkpoint_io.HFModel, ...]:
  """The Hugging Face models of a run of `config` holding `params`: a task
  run's ``{Prefix}{suffix}`` class, a pretraining run's family's own."""
  k = kind(config)
  if k is None:
    return tuple(family(config).hf_models(config, params))
  table = task_table(config.objective.encoder, k.name)
  return (checkpoint_io.HFModel("", table, config.model, params),)


def masked_lm(config, params) -> checkpoint_io.HFModel:
  """The run's model that fills masks (fill_mask, zero_shot): the first of
  its HF models whose table has a masked-LM head (ELECTRA: the
  generator). ValueError when it has none (a fine-tuned head)."""
  models = hf_models(config, params)
  for m in models:
    if m.table.masked_lm:
      return m
  raise ValueError(
      f"A {config.objective.name!r} run holds no masked-LM head (its models: "
      f"{', '.join(m.table.export_architecture for m in models)}): nothing "
      "to fill masks with.")


def encoder_config(config):
  """The model config of the encoder a run holds (a task run's own; a
  pretraining run's as its family reads it: ELECTRA's discriminator,
  DistilBERT's student), with the family's pooler activation."""
  if kind(config) is not None:
    return config_lib.complete_model(config.model.to_dict())
  return family(config).pretrained_encoder_config(config)


def encoder_params(config, params) -> dict:
  """The encoder a run holds, in a task model's tree: {encoder attr: its
  params[, "head": the family's transform]}. ValueError naming what is
  missing."""
  fam = family(config)
  if kind(config) is None:
    return fam.pretrained_encoder_params(config, params)
  transform = fam.head_layout.transform and kind(config).role != heads.EMBED
  keep = (fam.encoder_attr,) + (("head",) if transform else ())
  missing = [k for k in keep if k not in params]
  if missing:
    raise ValueError(f"A {config.objective.name!r} run on a {fam.name} "
                     f"encoder lacks {', '.join(missing)} in its params.")
  return {k: params[k] for k in keep}


def bare_encoder(config, params) -> tuple[object, dict]:
  """(model config, params) of the encoder a run holds, alone: the tree of
  its family's ``{Prefix}Model`` (``encoder_table``: no pooler, no
  transform), which ``mapping.make_model`` builds as a
  ``models.heads.EncoderModel``."""
  fam = family(config)
  mc = encoder_config(config)
  tree = {fam.encoder_attr: encoder_params(config, params)[fam.encoder_attr]}
  abstract = nnx.eval_shape(lambda: fam.encoder_table.make_model(
      mc, nnx.Rngs(0)))
  keep = set(mapping.flatten_params(
      nnx.state(abstract, nnx.Param).to_pure_dict()))
  return mc, mapping.unflatten_params(
      {k: v for k, v in mapping.flatten_params(tree).items() if k in keep})


def train_flops_per_step(config, work: flops_lib.Work | None = None) -> float:
  """Model FLOPs of one optimizer step of `config` on `work` (None: full
  rows of the global batch, ``flops.full_rows``)."""
  if work is None:
    work = flops_lib.full_rows(
        config.train.batch_size, config.data.seq_length,
        config.data.max_predictions_per_seq if kind(config) is None else 0)
  return objective(config).flops(config, work)


# ------------------------------------------------------------------------------
# What a Hugging Face directory is.
# ------------------------------------------------------------------------------
def hf_directory(hf_config, embedding=None) -> tuple[mapping.Table, dict]:
  """(the table that reads a Hugging Face directory with this config.json
  (None or {}: Google's BERT), the partial run config it implies: objective
  and model). Its class picks the table: a task class (``{Prefix}{suffix}``
  of a kind whose head has params) reads as that task run on the family's
  encoder, any other (a bare ``{Prefix}Model`` too) as the family's
  pretraining run. `embedding`: the directory's sentence-transformers
  modules (``hf.sentence_transformers.Modules``), which the run's model
  config carries (``model.embedding_pooling`` / ``embedding_normalize``,
  ``data.seq_length`` their length): an embedding model whose encoder
  also continues pretraining or takes any task head; one whose class no
  pretraining table reads (ELECTRA's discriminator alone) is the
  embedding run itself. ValueError for a model_type no family reads, or a
  directory that is half of a run (one ELECTRA network without
  sentence-transformers modules)."""
  hf_config = dict(hf_config or {})
  fam = families.by_model_type(hf_config.get("model_type", "bert"))
  arch = (hf_config.get("architectures") or [""])[0]
  k = (tasks.by_hf_suffix(arch[len(fam.class_prefix):])
       if arch.startswith(fam.class_prefix) else None)
  if k is not None and k.role != heads.EMBED and fam.reads_task_dir(
      hf_config):
    table = task_table(fam.name, k.name)
    model = table.config_from_hf(hf_config)
    return table, {"objective": {"name": k.objective, "encoder": fam.name},
                   "model": model.to_dict()}
  table = next((t for t in fam.pretraining_tables if arch in (
      t.export_architecture, t.default_architecture,
      *(c for _, c in t.architectures))), None)
  if embedding is not None and table is None:
    # A bare encoder no pretraining class of the family reads (ELECTRA's
    # discriminator alone): the embedding run itself.
    table = embedding_table(fam.name)
    run = {"objective": {"name": _embedding_kind().objective,
                         "encoder": fam.name}}
    model = table.config_from_hf(hf_config)
  else:
    table = table or fam.pretraining_tables[0]
    model = table.config_from_hf(hf_config)
    run = {"objective": dict(fam.hf_run_fields(model),
                             name=fam.objectives[0].name)}
  if embedding is not None:
    model.update(embedding_pooling=embedding.pooling,
                 embedding_normalize=bool(embedding.normalize))
    if embedding.max_seq_length:
      run["data"] = {"seq_length": int(embedding.max_seq_length)}
  return table, dict(run, model=model.to_dict())
