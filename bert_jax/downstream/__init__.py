"""Uses of a trained encoder: fine-tuning, metrics, embeddings, cloze.

  finetuning.py    one fine-tuning run (task kind, config from the
                   checkpoint, evaluator, results, predictions files) and
                   the learning-rate x seed sweep
  workdir_task.py  the task a fine-tuning workdir was trained on, recorded
                   and compared on every rerun
  sentence_tasks.py  task kind "sentence": GLUE, CSV / TSV / JSONL
  token_tasks.py   task kind "token": NER with conlleval scores
  span_tasks.py    task kind "span": SQuAD v1.1 / v2.0, official files
  metrics.py       accuracy, F1, Matthews, Pearson, Spearman, GLUE average
  entity_metrics.py  conlleval entity precision / recall / F1
  squad_metrics.py the official SQuAD EM / F1, HasAns / NoAns, thresholds
  span_answers.py  n-best spans over windows, v2 null odds
  embeddings.py    contextual vectors per sentence or token
  mask_filling.py  top-k predictions for [MASK] tokens
  cloze.py         zero-shot classification through the MLM head

May import everything below it (models, data, checkpoints, hf, pretrained,
objectives, training). Never an entry point.
"""
