"""Encoders and heads in Flax NNX, and their analytic FLOPs.

  layers.py    dense and LayerNorm with logical axis names, activations,
               initializers, rematerialization
  attention.py self-attention in every ``attention_impl`` kind over padded
               or packed rows: the mask API (make_mask, allowed, bias,
               attend) other encoder families call
  bert.py      BERT's embeddings, encoder blocks and heads
               (pretraining, masked LM, sequence classification)
  roberta.py   RoBERTa / XLM-R's masked LM: BERT's encoder with positions
               counted from the padding id
  albert.py    ALBERT: factorized embeddings, blocks shared across layers
  electra.py   ELECTRA's generator and discriminator on shared embeddings
  modernbert.py  ModernBERT: pre-norm GeGLU blocks, MLM and classification
               heads, as Hugging Face's
  rope_attention.py  rotary attention over global or sliding-window
               visibility (ModernBERT's)
  rotary.py    rotary position embeddings (``rotate_half`` layout)
  splash.py    the TPU splash-attention kernel behind attention_impl="splash"
  logical.py   activation sharding constraints by logical axis name
  flops.py     training FLOPs of an encoder and an MLM head, per token

Model code names logical axes only ("embed", "mlp", "heads", ...); the mesh
and the rules that map them live in the config (``training/sharding.py``).
May import: ``bert_jax.config_lib``. Nothing else of ours.
"""
