"""Export a run (pretraining or fine-tuning) as Hugging Face directories.

The run's config says which models its params are (``compose.hf_models``:
BERT one BertForPreTraining, a fine-tuned head its family's task class
(``{Prefix}ForSequenceClassification``, ``ForTokenClassification``,
``ForQuestionAnswering``; an embedding run its bare ``{Prefix}Model`` and
the sentence-transformers modules), ALBERT AlbertForPreTraining,
DistilBERT its student, ELECTRA discriminator/ and generator/), and each
is written by the one writer, ``checkpoint_io.save_hf_model`` (vocabulary
rows past the tokenizer left out), plus the files its kind adds
(``Kind.export_files``), so nothing here branches on the family or the
kind. A fine-tuned classifier
gets its label names from the run (its ``task.label_names``, else
``results.json``, else ``label_map.json``, else the GLUE task's names) as
``id2label`` / ``label2id``; heads a run did not train are flagged. No
mesh, no TensorFlow for local workdirs.

  from bert_jax import export
  export.export_run(WORKDIR, OUT)          # or tools/convert_to_hf.py
"""

from __future__ import annotations

import json
import os

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import pretrained
from bert_jax.data import task_sources
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping

RESULTS_FILE = "results.json"  # finetune.RESULTS_FILE (no TF import here).
LABEL_MAP_FILE = "label_map.json"  # task_sources.LABEL_MAP_FILE.


def run_label_names(source: pretrained.Source) -> tuple[str, ...]:
  """Class names in id order of a fine-tuning run, () when it has none
  (regression, or not a fine-tuning run): its task.label_names, else the
  results' or the label map's, else the GLUE task's."""
  task = (source.config or {}).get("task") or {}
  if task.get("label_names"):
    return tuple(task["label_names"])
  if source.workdir:
    text = pretrained.read_text(os.path.join(source.workdir, RESULTS_FILE))
    if text is not None and json.loads(text).get("label_names"):
      return tuple(json.loads(text)["label_names"])
    text = pretrained.read_text(os.path.join(source.workdir, LABEL_MAP_FILE))
    if text is not None:
      label2id = json.loads(text)["label2id"]
      return tuple(sorted(label2id, key=label2id.get))
  name = task.get("name", "")
  if name.startswith("glue/"):
    return task_sources.glue_task(name).label_names
  return ()


def untrained_heads(config, table: mapping.Table) -> tuple[str, ...]:
  """HF prefixes of `table`'s heads that a run with `config` left at their
  random init: the sentence-pair heads when it trained no NSP / SOP."""
  if config_lib.sentence_objective(config.data) != config_lib.PACKED:
    return ()
  return table.sentence_heads


def write_hf_models(output: str, params, config, *, tokenizer=None,
                    source: str = "", label_names=()) -> list[str]:
  """Writes the Hugging Face models of a run of `config` (complete) holding
  `params` under `output`; returns the files written, relative to it.

  `tokenizer`: a ``tokenizer_files.TokenizerSpec`` (tokenizer files and the
  pad id in each model), `source`: recorded in config.json, `label_names`:
  a classifier's class names.
  """
  written = []
  kind = compose.kind(config)
  for model in compose.hf_models(config, params):
    files = checkpoint_io.save_hf_model(
        os.path.join(output, model.subdir), model.params, model.model_config,
        table=model.table, tokenizer=tokenizer,
        untrained_heads=untrained_heads(config, model.table),
        label_names=label_names, source=source)
    if kind is not None and kind.export_files is not None:
      files += kind.export_files(os.path.join(output, model.subdir), config)
    written += [os.path.join(model.subdir, f) for f in files]
  return written


def export_run(path: str, output: str, step: int | None = None) -> list[str]:
  """Writes `output` (config.json, model.safetensors, tokenizer files; one
  directory per model of the run) for the run or checkpoint at `path`;
  returns the files written."""
  source = pretrained.resolve(path, step)
  params, _ = pretrained.load_params(source)
  where = source.workdir or source.path
  return write_hf_models(
      output, params, source.config,
      tokenizer=pretrained.tokenizer_spec(source),
      label_names=run_label_names(source),
      source=where if source.step is None else f"{where} step {source.step}")

