"""Input: sources, tokenizers, example building, in-graph masking, iterators.

  features.py       batch feature names, shapes and dtypes (one spec for the
                    pipeline, the steps, tools and tests)
  checks.py         config checks of the input a job reads (the sequence
                    shape; the pretraining pipeline's fields), no TensorFlow
  sources.py        which text files / records / TFDS splits a run reads
  records.py        JSONL and Parquet records -> text (one document each)
  prepared_text.py  record sources prepared once into text files, cached
  demo_corpus.py    the corpus every fresh machine has (CPython's docs)
  tokenizer_base.py the tokenizer interface; special tokens found by role
  tokenizers.py     in-graph SentencePiece / WordPiece, any tokenizer.json;
                    the run's, trained and cached
  hf_json_tokenizer.py  a Hugging Face tokenizer.json run host-side in the
                    graph; a byte-level BPE with RoBERTa's specials trained
  examples.py       NSP / SOP pairs and packed sequences from blocks of lines
  masking.py        MLM masking inside the tf.data graph (stateless, resumable)
  shard_format.py   pre-tokenized shards: blocks, offsets, the manifest
  pretokenizing.py  a corpus's text files into shards over worker processes
  shard_source.py   a shards:DIR source: global order per epoch, resumable
  packing.py        several examples per row: best-fit decreasing in windows
  pipeline.py       assembles the pretraining tf.data pipeline
  iterator.py       per-host batches with a saveable state and data counters
  task_sources.py   downstream tasks: GLUE (TFDS) and the user's CSV/TSV/JSONL
  task_data.py      downstream batches: [CLS] A [SEP] B [SEP], length buckets
                    or packed rows
  token_sources.py  token tagging: CoNLL columns, JSONL, TFDS conll2003
  squad_sources.py  extractive QA: SQuAD v1.1 / v2.0 JSON, TFDS squad
  token_features.py words -> sub-tokens -> windows, every word predicted once
  span_features.py  [CLS] q [SEP] context windows with character offsets
  feature_batches.py  windows, max context, bucketed batches of precomputed
                    features with a JSON resume state
  feature_packing.py  precomputed features packed several a row (host-side
                    best-fit decreasing), a resumable packed iterator
  pair_sources.py   sentence pairs: the user's CSV/TSV/JSONL (every row
                    whole), TFDS glue/stsb and glue/mrpc
  pair_batches.py   pairs / triplets of texts each encoded alone: [B, K, L]
                    batches, a resumable iterator, eval batches
  beir.py           BEIR retrieval files: corpus (streamed), queries, qrels

May import: ``config_lib`` and ``models``. Never training, downstream or an
entry point.
"""
