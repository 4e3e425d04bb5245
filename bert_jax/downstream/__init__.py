"""Uses of a trained encoder: fine-tuning, metrics, embeddings, cloze.

  finetuning.py    one fine-tuning run (task, config from the checkpoint,
                   evaluator, results) and the learning-rate x seed sweep
  metrics.py       accuracy, F1, Matthews, Pearson, Spearman, GLUE average
  embeddings.py    contextual vectors per sentence or token
  mask_filling.py  top-k predictions for [MASK] tokens
  cloze.py         zero-shot classification through the MLM head

May import everything below it (models, data, checkpoints, hf, pretrained,
objectives, training). Never an entry point.
"""
