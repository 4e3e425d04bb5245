"""Fine-tuning task kinds: each owns its task, once.

A kind declares, in one module, everything that is its own: reading the
task's data (every check before anything is written), its features and
batches, its head (what the head reads, how many outputs, the Hugging Face
class suffix), its loss and metrics (pure functions), how its outputs are
scored and written as predictions files. It knows nothing of encoder
families: any family's encoder carries any kind's head
(``bert_jax/compose.py``; ``models.heads.TaskModel``).

  sentence.py         "sentence": GLUE, CSV / TSV / JSONL; classification or
                      regression on one vector per example
  pairs.py            "pairs": sentence embeddings trained on pairs
                      (in-batch negatives, CoSENT), scored on STS, paraphrase
                      pairs and BEIR retrieval
  token.py            "token": NER tagging, conlleval scores
  span.py             "span": SQuAD v1.1 / v2.0 extractive QA, the official
                      files
  sentence_metrics.py accuracy, F1, Matthews, Pearson, Spearman, GLUE average
  entity_metrics.py   conlleval entity precision / recall / F1
  squad_metrics.py    the official SQuAD EM / F1, HasAns / NoAns, thresholds
  span_answers.py     n-best spans over windows, v2 null odds
  pair_losses.py      InfoNCE over the global batch, CoSENT, Matryoshka
  pair_metrics.py     STS correlation, best-threshold paraphrase scores
  retrieval_metrics.py  nDCG / MRR / recall / MAP as trec_eval, run files

Adding a kind is one module here and one line in :data:`MODULES`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax.numpy as jnp

from bert_jax.data import checks as data_checks
from bert_jax.objectives import safe_div


@dataclasses.dataclass(frozen=True)
class Kind:
  """One task kind. See the module docstring."""
  name: str  # task.kind
  objective: str  # objective.name of its runs (the log and the record)
  # The head: what it reads (``models.heads`` role: "pooled", "token",
  # "span"), its output's name in our tree, how many outputs for a model
  # config, and the Hugging Face class suffix ("ForSequenceClassification").
  role: str
  output_name: str
  outputs: Callable[..., int]
  hf_suffix: str
  # Whether the output's width is model.num_labels (named in shape errors).
  outputs_are_labels: bool
  # (model_config, label_names) -> config.json entries of the task class.
  config_fields: Callable[..., dict]
  # The objective's pieces (``objectives.Objective``): features, loss
  # sums, counts, loss, metrics, per-example outputs, log keys, checks.
  feature_spec: Callable[..., dict]
  loss_sums: Callable[..., dict]
  counts: Callable[..., dict]
  loss: Callable[..., Any]
  metrics: Callable[..., dict]
  predict: Callable[..., dict]
  log_keys: tuple[tuple[str, str], ...]
  validate: Callable[..., None]
  packing: bool
  # The task: (config, label_dir) -> (task, train rows, {split: rows}),
  # every check, nothing written; (workdir, task) -> its label map
  # written; (config, tok, task, train, evals) -> Input (train_iter,
  # eval_splits, num_train); (task, input, config) -> Scorer (score(split,
  # [(example index, outputs)]) -> metrics, details, write(dir));
  # (scores) -> the main score.
  read: Callable[..., tuple]
  save: Callable[..., None]
  make_input: Callable[..., Any]
  make_scorer: Callable[..., Any]
  main_score: Callable[[dict], float]
  # The TFDS task names that are this kind's (task.kind follows them).
  tfds_tasks: tuple[str, ...] = ()
  # (config, model config of the encoder it starts from) -> model config
  # fields of the head a run takes from its task settings or else from the
  # checkpoint (the pairs kind's pooling); {} for heads with none.
  head_fields: Callable[..., dict] = lambda config, model_config: {}
  # (directory, run config) -> files an export writes beside the Hugging
  # Face model (the pairs kind's sentence-transformers modules); None.
  export_files: Callable[..., list] | None = None
  # The loss in two parts (``objectives.SplitLoss``), for the cached-
  # gradient step; None: a loss of the whole batch.
  split: Any = None


# kind name -> the module defining KIND. Every module is imported on first
# use of the registry, so what is known never depends on import order.
MODULES = {
    "sentence": "bert_jax.tasks.sentence",
    "token": "bert_jax.tasks.token",
    "span": "bert_jax.tasks.span",
    "pairs": "bert_jax.tasks.pairs",
}


def all_kinds() -> dict[str, Kind]:
  """Every kind, by name."""
  return {name: importlib.import_module(module).KIND
          for name, module in MODULES.items()}


def names() -> tuple[str, ...]:
  return tuple(MODULES)


def get(name: str) -> Kind:
  """The kind `name` (a ValueError lists the others)."""
  if name not in MODULES:
    raise ValueError(f"task.kind={name!r} must be one of "
                     f"{sorted(MODULES)}.")
  return all_kinds()[name]


def by_objective(objective: str) -> Kind | None:
  """The kind whose runs' objective.name is `objective`, or None (a
  pretraining objective)."""
  return next((k for k in all_kinds().values() if k.objective == objective),
              None)


def by_hf_suffix(suffix: str) -> Kind | None:
  """The kind whose Hugging Face classes end in `suffix`, or None."""
  return next((k for k in all_kinds().values() if k.hf_suffix == suffix),
              None)


def check_task_run(config) -> None:
  """Every kind's run checks: one phase, and the sequence shape. The
  pretraining pipeline's (tokenizer training, masking, sentence pairs) do
  not apply: rows come from the task with the checkpoint's tokenizer."""
  if config.train.phases or config.train.recipe:
    raise ValueError("train.phases / train.recipe apply to pretraining runs "
                     "only (a fine-tuning run's batches are its task's "
                     "length buckets, task.buckets); leave them empty.")
  data_checks.check_sequence(config)


def example_counts(batch, config) -> dict:
  """The global batch's real examples (rows, or packed slots, of weight 1;
  padding rows 0): what a per-example loss is averaged over."""
  del config
  return dict(examples=jnp.sum(batch["example_weights"]))


def mean_over_examples(sums, counts, config):
  """The loss sum over the global batch's real examples."""
  del config
  return safe_div(sums["loss"], counts["examples"])


def check_num_labels(config, what: str) -> None:
  if int(config.model.num_labels) < 1:
    raise ValueError(f"model.num_labels={config.model.num_labels} must be >= 1"
                     f" ({what}).")
