"""XLM-R (Conneau et al. 2020): RoBERTa's architecture and tables under
``model_type`` "xlm-roberta" and the ``XLMRoberta*`` class names
(``families/roberta.py`` builds both)."""

from __future__ import annotations

from bert_jax.families import roberta
from bert_jax.objectives import roberta as roberta_objective

FAMILY = roberta.family("xlm-roberta", "XLM-R", "XLMRoberta",
                        roberta_objective.XLM_OBJECTIVE)
