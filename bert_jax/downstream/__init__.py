"""Uses of a trained encoder: fine-tuning runs, embeddings, cloze.

  finetuning.py    one fine-tuning run (a task kind's head on the
                   checkpoint's family's encoder, evaluator, results,
                   predictions files) and the learning-rate x seed sweep
  workdir_task.py  the task a fine-tuning workdir was trained on, recorded
                   and compared on every rerun
  embeddings.py    contextual vectors per sentence or token
  sentence_embeddings.py  sentence vectors of an embedding model, several
                   sentences packed per row, streamed to .npy files
  mask_filling.py  top-k predictions for [MASK] tokens (a file of texts on
                   packed rows)
  packed_texts.py  tokenized texts packed several a row for inference
  cloze.py         zero-shot classification through the MLM head

The task kinds themselves (reading, heads, losses, metrics, predictions
files) are ``bert_jax/tasks/``. May import everything below it (models,
data, checkpoints, hf, objectives, families, tasks, compose, pretrained,
training). Never an entry point.
"""
