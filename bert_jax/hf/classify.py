"""Sequence-classification tables: a fine-tuned classifier of each family as
that family's Hugging Face class, read both ways.

A classifier fine-tuned here is one module whatever it started from
(``models.bert.BertForSequenceClassification``: embeddings, the E -> H
projection when E != H, untied layers, a dense + activation on [CLS] and a
linear classifier). Each table below names those params as the encoder's
family does, and the head as its class does; ``model.pooler_act`` makes the
head compute what that class computes (fine-tuning sets it from the source,
``objectives.encoder_config``):

  encoder   Hugging Face class                  our pooler -> HF            act
  bert      BertForSequenceClassification       bert.pooler.dense           tanh
  albert    AlbertForSequenceClassification     albert.pooler               tanh
  electra   ElectraForSequenceClassification    classifier.dense            gelu
  distil    DistilBertForSequenceClassification pre_classifier              relu

and ``classifier`` is ``classifier`` (ELECTRA: ``classifier.out_proj``).
ALBERT's layers were untied by fine-tuning, so its export has one group per
layer (``num_hidden_groups = num_hidden_layers``): the same function, each
layer its own weights. The run's ``objective.encoder`` picks the table
(:func:`for_encoder`); on import, a directory of one of these classes is a
``classify`` run with that encoder (``Family.objective_fields``).

Token tagging and extractive QA (``token_classify``, ``span_qa``) follow the
same pattern: per encoder family the encoder rows without the pooler, and
the class's linear head on every token (``classifier``; ``qa_outputs`` to
start / end), exported as ``<Family>ForTokenClassification`` /
``<Family>ForQuestionAnswering`` (``for_encoder(encoder, objective)``).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from bert_jax.hf import bert as hf_bert
from bert_jax.hf import electra as hf_electra
from bert_jax.hf import families as hf_families
from bert_jax.hf import mapping
from bert_jax.hf.mapping import Row
from bert_jax.models import bert as model_lib

# The fine-tuning objectives these tables' params belong to.
CLASSIFY, TOKEN, SPAN = "classify", "token_classify", "span_qa"


def classification_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF sequence classification: num_labels,
  id2label / label2id (the run's names, else LABEL_i) and problem_type
  (regression for one output, as HF infers it)."""
  n = int(model_config.num_labels)
  names = list(label_names) if len(label_names) == n else [
      f"LABEL_{i}" for i in range(n)]
  return dict(num_labels=n, id2label={str(i): x for i, x in enumerate(names)},
              label2id={x: i for i, x in enumerate(names)},
              problem_type="regression" if n == 1 else
              "single_label_classification")


def for_encoder(encoder: str, objective: str = CLASSIFY) -> mapping.Family:
  """The table of a head of `objective` (classify, token_classify, span_qa)
  fine-tuned from `encoder` (a pretraining objective name: objective.encoder
  of the run)."""
  for fam in mapping.families().values():
    if objective in fam.objectives and fam.objective_fields(None)[
        "encoder"] == encoder:
      return fam
  raise ValueError(f"objective.encoder={encoder!r}: no Hugging Face "
                   f"{objective} table for a head fine-tuned from it.")


def _make_model(model_config, rngs):
  return model_lib.BertForSequenceClassification(model_config, rngs=rngs)


def _head_rows(pooler: str, classifier: str) -> tuple[Row, ...]:
  """The pooler (dense on [CLS]) and the classifier under HF names."""
  return (Row("bert.pooler.kernel", f"{pooler}.weight", "", True, False),
          Row("bert.pooler.bias", f"{pooler}.bias", "", False, False),
          Row("classifier.kernel", f"{classifier}.weight", "", True, False),
          Row("classifier.bias", f"{classifier}.bias", "", False, False))


def _from_hf(config_from_hf, pooler_act: str):
  """A family's config.json reader plus the classifier's fields."""
  def read(hf_cfg) -> ml_collections.ConfigDict:
    mc = config_from_hf(hf_cfg)
    labels = hf_cfg.get("num_labels") or len(hf_cfg.get("id2label") or {})
    if labels:
      mc.num_labels = int(labels)
    mc.pooler_act = pooler_act
    return mc
  return read


def _register(name, *, encoder: str, rows, architecture: str, model_type: str,
              base_prefix: str, shape_fields=None, **kwargs
              ) -> mapping.Family:
  """One classify table; its head rows are the last four (pooler, then
  classifier)."""
  pooler, classifier = (rows[i].hf.rsplit(".", 1)[0] for i in (-4, -2))
  return mapping.register(mapping.Family(
      name=name, model_type=model_type, make_model=_make_model, rows=rows,
      heads={"bert.pooler": pooler, "classifier": classifier},
      architectures=((classifier + ".", architecture),),
      default_architecture=architecture, export_architecture=architecture,
      base_prefix=base_prefix,
      shape_fields={**(shape_fields or {}), "classifier": "num_labels"},
      objectives=(CLASSIFY,),
      objective_fields=lambda mc: {"encoder": encoder},
      config_fields=classification_fields, **kwargs))


# --------------------------------------------------------------------------
# BERT: BertForSequenceClassification (pooler -> dropout -> linear).
# --------------------------------------------------------------------------
BERT_CLASSIFY = mapping.register(mapping.Family(
    name="bert_classify", model_type="bert", make_model=_make_model,
    # The encoder rows are BERT's; the classifier replaces the pretraining
    # heads. Google's TF names too (run_classifier.py's output_weights).
    rows=tuple(r for r in hf_bert.BERT.rows if r.ours.startswith("bert.")) + (
        Row("classifier.kernel", "classifier.weight", "output_weights", True, True),
        Row("classifier.bias", "classifier.bias", "output_bias", False, False),
    ),
    heads={"bert.pooler": "bert.pooler", "classifier": "classifier"},
    architectures=(("classifier.", "BertForSequenceClassification"),),
    default_architecture="BertModel",
    base_prefix="bert.",
    shape_fields={"classifier": "num_labels"},
    export_architecture="BertForSequenceClassification",
    objectives=(CLASSIFY,),
    objective_fields=lambda mc: {"encoder": "bert"},
    config_fields=classification_fields,
))


# --------------------------------------------------------------------------
# ALBERT: AlbertForSequenceClassification (pooler + tanh -> linear), one
# group per fine-tuned layer.
# --------------------------------------------------------------------------
def _albert_rows() -> tuple[Row, ...]:
  group = "albert.groups.{i}.layers.0."
  out = []
  for r in hf_families.ALBERT.rows:
    if r.ours.startswith(group):
      ours = "bert.layers.{i}." + r.ours[len(group):]
    elif r.ours.startswith(("albert.embeddings", "albert.pooler")):
      ours = "bert." + r.ours[len("albert."):]
    else:  # MLM and SOP heads.
      continue
    out.append(Row(ours, r.hf, "", r.transpose_hf, False))
  return tuple(out) + (
      Row("classifier.kernel", "classifier.weight", "", True, False),
      Row("classifier.bias", "classifier.bias", "", False, False))


def _albert_to_hf(mc, pad_token_id: int = 0) -> dict:
  untied = ml_collections.ConfigDict(mc.to_dict())
  untied.num_hidden_groups = int(mc.num_hidden_layers)
  cfg = hf_families.ALBERT.config_to_hf(untied, pad_token_id)
  cfg["architectures"] = ["AlbertForSequenceClassification"]
  return cfg


def _untied(hf_cfg) -> bool:
  """One group per layer: our export. A released ALBERT classifier shares
  its groups; the ALBERT table reads it (an ``albert`` run whose encoder
  fine-tuning copies into every layer, the classifier fresh)."""
  return hf_cfg.get("num_hidden_groups", 1) == hf_cfg.get(
      "num_hidden_layers", 12)


ALBERT_CLASSIFY = _register(
    "albert_classify", encoder="albert", rows=_albert_rows(),
    architecture="AlbertForSequenceClassification", model_type="albert",
    base_prefix="albert.", shape_fields={"embeddings.": "embedding_size"},
    config_to_hf=_albert_to_hf, reads=_untied,
    config_from_hf=_from_hf(hf_families.ALBERT.config_from_hf, "tanh"))


# --------------------------------------------------------------------------
# ELECTRA: ElectraForSequenceClassification (dense + gelu on [CLS] ->
# out_proj), the discriminator's encoder.
# --------------------------------------------------------------------------
def _electra_rows() -> tuple[Row, ...]:
  out = [Row(r.ours, "electra." + r.hf[len("bert."):], "", r.transpose_hf,
             False)
         for r in hf_bert.BERT.rows
         if r.ours.startswith(("bert.embeddings.", "bert.layers."))]
  out[5:5] = [
      Row("bert.embeddings_project.kernel", "electra.embeddings_project.weight", "", True, False),
      Row("bert.embeddings_project.bias", "electra.embeddings_project.bias", "", False, False)]
  return tuple(out) + _head_rows("classifier.dense", "classifier.out_proj")


def _electra_to_hf(mc, pad_token_id: int = 0) -> dict:
  net = ml_collections.ConfigDict(mc.to_dict())
  net.embedding_size = model_lib.embedding_size(mc)
  cfg = hf_electra.DISCRIMINATOR_FAMILY.config_to_hf(net, pad_token_id)
  cfg["architectures"] = ["ElectraForSequenceClassification"]
  return cfg


ELECTRA_CLASSIFY = _register(
    "electra_classify", encoder="electra", rows=_electra_rows(),
    architecture="ElectraForSequenceClassification", model_type="electra",
    base_prefix="electra.", optional=("embeddings_project",),
    shape_fields={"embeddings.": "embedding_size"},
    config_to_hf=_electra_to_hf,
    config_from_hf=_from_hf(hf_electra.DISCRIMINATOR_FAMILY.config_from_hf,
                            "gelu"))


# --------------------------------------------------------------------------
# DistilBERT: DistilBertForSequenceClassification (pre_classifier + ReLU on
# [CLS] -> classifier), the student's encoder (no segment table).
# --------------------------------------------------------------------------
def _distil_to_hf(mc, pad_token_id: int = 0) -> dict:
  cfg = hf_families.DISTILBERT.config_to_hf(mc, pad_token_id)
  cfg.update(architectures=["DistilBertForSequenceClassification"],
             seq_classif_dropout=float(mc.hidden_dropout_prob))
  return cfg


DISTILBERT_CLASSIFY = _register(
    "distilbert_classify", encoder="distil",
    rows=tuple(r for r in hf_families.DISTILBERT.rows
               if r.ours.startswith("bert.")) + _head_rows(
                   "pre_classifier", "classifier"),
    architecture="DistilBertForSequenceClassification",
    model_type="distilbert", base_prefix="distilbert.",
    config_to_hf=_distil_to_hf,
    config_from_hf=_from_hf(hf_families.DISTILBERT.config_from_hf, "relu"))


# --------------------------------------------------------------------------
# Token tagging and extractive QA: each family's encoder rows (no pooler)
# and a linear head on every token, as <Family>ForTokenClassification
# (dropout -> classifier) and <Family>ForQuestionAnswering (qa_outputs).
# --------------------------------------------------------------------------
def token_classification_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF token classification: num_labels and
  id2label / label2id (the run's tag names, else LABEL_i)."""
  fields = classification_fields(model_config, label_names)
  fields.pop("problem_type")
  return fields


def qa_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF question answering: num_labels=2."""
  del model_config, label_names
  return dict(num_labels=2)  # HF sizes qa_outputs by num_labels: start, end.


def _token_model(model_config, rngs):
  return model_lib.BertForTokenClassification(model_config, rngs=rngs)


def _qa_model(model_config, rngs):
  return model_lib.BertForQuestionAnswering(model_config, rngs=rngs)


# objective -> (class suffix, our head, its model, config.json fields).
_PER_TOKEN = {
    TOKEN: ("ForTokenClassification", "classifier", _token_model,
            token_classification_fields),
    SPAN: ("ForQuestionAnswering", "qa_outputs", _qa_model, qa_fields),
}


def _with_architecture(config_to_hf, architecture: str):
  """A classify table's config.json writer, naming another class."""
  if config_to_hf is None:  # BertConfig: the table's export_architecture.
    return None
  def write(mc, pad_token_id: int = 0) -> dict:
    cfg = config_to_hf(mc, pad_token_id)
    cfg["architectures"] = [architecture]
    return cfg
  return write


def _register_per_token(classify_table: mapping.Family, objective: str,
                        name: str, *, encoder: str, tf_names=("", "")
                        ) -> mapping.Family:
  """The `objective` table of `encoder`: the classify table's encoder rows
  (pooler and classifier left out) and the head (Google TF names
  `tf_names` for BERT's)."""
  suffix, head, make_model, fields = _PER_TOKEN[objective]
  cls = classify_table.export_architecture.replace(
      "ForSequenceClassification", suffix)
  rows = tuple(r for r in classify_table.rows if not r.ours.startswith(
      ("bert.pooler.", "classifier.")))
  rows += (Row(f"{head}.kernel", f"{head}.weight", tf_names[0], True,
               bool(tf_names[0])),
           Row(f"{head}.bias", f"{head}.bias", tf_names[1], False, False))
  shape_fields = dict(classify_table.shape_fields)
  shape_fields.pop("classifier", None)
  if objective == TOKEN:
    shape_fields["classifier"] = "num_labels"
  return mapping.register(dataclasses.replace(
      classify_table, name=name, make_model=make_model, rows=rows,
      heads={head: head}, architectures=((head + ".", cls),),
      export_architecture=cls,
      default_architecture=(classify_table.default_architecture
                            if classify_table.config_to_hf is None else cls),
      shape_fields=shape_fields, objectives=(objective,),
      objective_fields=lambda mc: {"encoder": encoder},
      config_fields=fields,
      config_to_hf=_with_architecture(classify_table.config_to_hf, cls)))


# google-research/bert names the heads output_* (run_classifier.py's
# BERT-NER ports) and cls/squad/output_* (run_squad.py).
BERT_TOKEN_CLASSIFY = _register_per_token(
    BERT_CLASSIFY, TOKEN, "bert_token_classify", encoder="bert",
    tf_names=("output_weights", "output_bias"))
BERT_QA = _register_per_token(
    BERT_CLASSIFY, SPAN, "bert_qa", encoder="bert",
    tf_names=("cls/squad/output_weights", "cls/squad/output_bias"))
ALBERT_TOKEN_CLASSIFY = _register_per_token(
    ALBERT_CLASSIFY, TOKEN, "albert_token_classify", encoder="albert")
ALBERT_QA = _register_per_token(ALBERT_CLASSIFY, SPAN, "albert_qa",
                                encoder="albert")
ELECTRA_TOKEN_CLASSIFY = _register_per_token(
    ELECTRA_CLASSIFY, TOKEN, "electra_token_classify", encoder="electra")
ELECTRA_QA = _register_per_token(ELECTRA_CLASSIFY, SPAN, "electra_qa",
                                 encoder="electra")
DISTILBERT_TOKEN_CLASSIFY = _register_per_token(
    DISTILBERT_CLASSIFY, TOKEN, "distilbert_token_classify", encoder="distil")
DISTILBERT_QA = _register_per_token(DISTILBERT_CLASSIFY, SPAN,
                                    "distilbert_qa", encoder="distil")
