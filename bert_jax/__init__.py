"""bert_jax: BERT pretraining in JAX/Flax NNX, from one CPU to a TPU pod."""
