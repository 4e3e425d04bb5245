"""HF ``BertForSequenceClassification``: BERT's encoder rows plus the head.

A family table like BERT's (registered on import of ``hf.mapping``), read
both ways: export writes ``classifier.weight`` (our kernel transposed) and
``classifier.bias``; import fills a missing classifier fresh (a BertModel or
BertForPreTraining directory) and reports it. ``classify`` runs export here.
"""

from __future__ import annotations

from bert_jax.hf import mapping


def _bert_classify_model(model_config, rngs):
  from bert_jax import model as model_lib
  return model_lib.BertForSequenceClassification(model_config, rngs=rngs)


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


BERT_CLASSIFY = mapping.register(mapping.Family(
    name="bert_classify", model_type="bert", make_model=_bert_classify_model,
    # The encoder rows are BERT's; the classifier replaces the pretraining
    # heads (HF BertForSequenceClassification: pooler -> dropout -> linear).
    rows=tuple(r for r in mapping.BERT.rows if r.ours.startswith("bert.")) + (
        mapping.Row("classifier.kernel", "classifier.weight", "output_weights", True, True),
        mapping.Row("classifier.bias", "classifier.bias", "output_bias", False, False),
    ),
    heads={"bert.pooler": "bert.pooler", "classifier": "classifier"},
    architectures=(("classifier.", "BertForSequenceClassification"),),
    default_architecture="BertModel",
    base_prefix="bert.",
    shape_fields=dict(mapping.BERT.shape_fields, classifier="num_labels"),
    export_architecture="BertForSequenceClassification",
    objectives=("classify",),
    config_fields=classification_fields,
))
