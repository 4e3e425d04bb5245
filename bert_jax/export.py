"""Export a run (pretraining or fine-tuning) as a Hugging Face directory.

The run's stored config decides the class: its objective picks the family
table (``hf.mapping.for_objective``: ``bert`` -> BertForPreTraining,
``classify`` -> BertForSequenceClassification), so nothing here branches on
the objective. A fine-tuned classifier gets its label names from the run
(``results.json``, else ``label_map.json``, else the GLUE task's names) as
``id2label`` / ``label2id``. No mesh, no TensorFlow for local workdirs.

  from bert_jax import export
  export.export_run(WORKDIR, OUT)          # or tools/convert_to_hf.py
"""

from __future__ import annotations

import json
import os

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.data import task_sources
from bert_jax.hf import checkpoint_io
from bert_jax.hf import electra
from bert_jax.hf import mapping

RESULTS_FILE = "results.json"  # finetune.RESULTS_FILE (no TF import here).
LABEL_MAP_FILE = "label_map.json"  # task_sources.LABEL_MAP_FILE.


def run_label_names(source: pretrained.Source) -> tuple[str, ...]:
  """Class names in id order of a fine-tuning run, () when it has none
  (regression, or not a fine-tuning run)."""
  if source.workdir:
    text = pretrained.read_text(os.path.join(source.workdir, RESULTS_FILE))
    if text is not None and json.loads(text).get("label_names"):
      return tuple(json.loads(text)["label_names"])
    text = pretrained.read_text(os.path.join(source.workdir, LABEL_MAP_FILE))
    if text is not None:
      label2id = json.loads(text)["label2id"]
      return tuple(sorted(label2id, key=label2id.get))
  task = (source.config or {}).get("task") or {}
  name = task.get("name", "")
  if name.startswith("glue/"):
    return task_sources.glue_task(name).label_names
  return ()


def export_run(path: str, output: str, step: int | None = None) -> list[str]:
  """Writes `output` (config.json, model.safetensors, tokenizer files) for
  the run or checkpoint at `path`; returns the files written."""
  source = pretrained.resolve(path, step)
  model_config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, model_config)
  where = source.workdir or source.path
  objective = ((source.config or {}).get("objective") or {}).get("name")
  if objective in _PAIR_WRITERS:  # Two HF models from one run (ELECTRA).
    return _PAIR_WRITERS[objective](
        output, params, source.config,
        tokenizer=pretrained.tokenizer_spec(source),
        source=f"{where} step {source.step}")
  hook = objectives.get(objective).hf_export if objective else None
  if hook is not None:  # A family of its own (ALBERT, DistilBERT student).
    family, model_config = hook(config_lib.complete(source.config))
    return checkpoint_io.save_hf_model(
        output, params, model_config, family=family,
        tokenizer=pretrained.tokenizer_spec(source), untrained_heads=(),
        source=f"{where} step {source.step}")
  return checkpoint_io.save_hf_model(
      output, params, model_config,
      family=source.family or pretrained.run_family(source.config),
      tokenizer=pretrained.tokenizer_spec(source),
      untrained_heads=pretrained.untrained_heads(source.config),
      label_names=run_label_names(source),
      source=f"{where} step {source.step}" if source.step is not None
      else where)


def _electra_pair(*args, **kwargs):
  return electra.save_pretrained(*args, **kwargs)


# Objectives whose run is exported as several HF directories.
_PAIR_WRITERS = {"electra": _electra_pair}


def architecture(objective: str) -> str:
  """The Hugging Face class a run of `objective` exports as."""
  return mapping.for_objective(objective).export_architecture
