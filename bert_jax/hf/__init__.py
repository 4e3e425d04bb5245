"""Hugging Face interop: one parameter-name table per family, read both ways.

  mapping          the table format, the registry (``TABLE_MODULES``: every
                   family and its module, loaded on first use) and the
                   export direction (our param tree -> HF state dicts)
  importing        the import direction (HF / Google TF state dict -> our
                   param tree) with a report of what was loaded
  bert             BERT (pretraining, MLM, BertModel)
  families         ALBERT and DistilBERT tables and config.json conversions
  electra          ELECTRA's two networks and the pair directory
  modernbert       ModernBERT's MLM and sequence-classification tables
  classify         fine-tuned classifiers, each as its encoder family's
                   Hugging Face sequence-classification class
  vocab            vocabulary rows past the tokenizer: trimmed on export,
                   padded back on import
  checkpoint_io    safetensors / pytorch_model.bin / TF checkpoint / config.json
                   reading and writing, our imported-directory format
  tokenizer_files  our tokenizers as `tokenizers` objects and HF tokenizer files

"What is at this path" (workdir, step, imported, HF dir, TF checkpoint) is
``bert_jax.pretrained``. May import: ``config_lib``, ``models``, ``data``.
"""
