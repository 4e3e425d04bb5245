"""Hugging Face interop that knows no family: the parameter-table format,
read both ways, and the files.

  mapping          the table format (``Table``, ``Row``) and the export
                   direction (our param tree -> HF state dicts)
  importing        the import direction (HF / Google TF state dict -> our
                   param tree) with a report of what was loaded
  vocab            vocabulary rows past the tokenizer: trimmed on export,
                   padded back on import
  checkpoint_io    safetensors / pytorch_model.bin / TF checkpoint / config.json
                   reading and writing, our imported-directory format
  tokenizer_files  our tokenizers as `tokenizers` objects and HF tokenizer files
  sentence_transformers  a sentence-transformers directory's modules (pooling,
                   normalisation, length), read and written

The tables themselves are the families' (``bert_jax/families/``), a task
head's derived by ``bert_jax/compose.py``; "what is at this path"
(workdir, step, imported, HF dir, TF checkpoint) is ``bert_jax.pretrained``.
May import: ``config_lib``, ``models``, ``data``.
"""
