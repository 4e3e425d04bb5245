"""Hugging Face interop, one job per module.

  mapping          per-family parameter-name tables (registry), used both ways
  checkpoint_io    safetensors / pytorch_model.bin / TF checkpoint / config.json
                   reading and writing, our imported-directory format
  tokenizer_files  our tokenizers as `tokenizers` objects and HF tokenizer files

"What is at this path" (workdir, step, imported, HF dir, TF checkpoint) is
``bert_jax.pretrained``.
"""

# Families beyond BERT register their tables on import.
from bert_jax.hf import families  # noqa: E402,F401  pylint: disable=g-import-not-at-top
