"""Default config groups shared by every file under configs/.

A config is a ``ConfigDict`` with six groups: ``objective`` (which
pluggable objective trains), ``model`` (field names as in Hugging Face
``BertConfig``), ``data``, ``train``, ``mesh`` and ``checkpoint``. Defaults
are declared here once; code reads fields directly, and configs from
elsewhere (a checkpoint's meta, an imported model) go through
:func:`complete` first.
Files in ``configs/`` call :func:`get_config` with a model size and override
what they need; users override anything on the command line
(``--config.train.num_steps=10``).
"""

import ml_collections

TOKENIZER_TYPES = ("sentencepiece", "wordpiece", "hf_json")
# Sentence-level objective of pretraining batches (data.objective).
NSP, SOP, PACKED = "nsp", "sop", "packed"
SENTENCE_OBJECTIVES = (NSP, SOP, PACKED)

# name -> (num_hidden_layers, hidden_size). Turc et al. 2019 / Devlin et al. 2019.
MODEL_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


def model_config(size: str = "base") -> ml_collections.ConfigDict:
  """BertConfig-compatible hyperparameters; head size 64 and FFN 4x hidden."""
  layers, hidden = MODEL_SIZES[size]
  return ml_collections.ConfigDict(dict(
      vocab_size=30522,
      hidden_size=hidden,
      # Width of the embedding tables (HF ElectraConfig/AlbertConfig name);
      # 0 = hidden_size. Otherwise a projection E -> H follows (ELECTRA,
      # ALBERT).
      embedding_size=0,
      num_hidden_layers=layers,
      num_attention_heads=hidden // 64,
      intermediate_size=4 * hidden,
      hidden_act="gelu",
      hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1,
      max_position_embeddings=512,
      type_vocab_size=2,  # 0: no segment embeddings (DistilBERT).
      # The padding token's id (HF ``pad_token_id``). With
      # positions_from_pad (RoBERTa, XLM-R) it sets the positions: a token's
      # position id is pad_token_id + 1 + its index among the row's tokens
      # that are not padding (HF's ``create_position_ids_from_input_ids``),
      # padding takes pad_token_id, so rows hold at most
      # max_position_embeddings - pad_token_id - 1 tokens.
      pad_token_id=0,
      positions_from_pad=False,
      # ALBERT layer sharing (HF AlbertConfig): num_hidden_layers applications
      # of num_hidden_groups groups of inner_group_num layers each.
      num_hidden_groups=1,
      inner_group_num=1,
      classifier_dropout_prob=0.1,  # ALBERT's SOP head.
      initializer_range=0.02,
      layer_norm_eps=1e-12,
      num_labels=2,  # Fine-tuning heads only (1 = regression).
      # The pooler's activation on [CLS]: "tanh" (BERT, ALBERT); a
      # classifier fine-tuned from ELECTRA has "gelu" (HF's
      # ElectraClassificationHead), from DistilBERT "relu" (its
      # pre_classifier), so that it exports to that family's class exactly.
      pooler_act="tanh",
      # Compute dtype of activations and matmul inputs; params stay float32.
      dtype="float32",
      # Speed options (docs/performance.md "Speed options" has their
      # measured effect).
      # "xla": explicit softmax attention (supports attention dropout);
      # "dot_product_attention": jax.nn.dot_product_attention, cuDNN flash
      # attention on GPU in bf16/fp16, XLA elsewhere ("cudnn" forces it).
      # "splash": the TPU Pallas flash kernel (seq a multiple of 128).
      # The fused kinds have no attention dropout: set
      # attention_probs_dropout_prob=0 to train with them.
      attention_impl="xla",
      # Tests only: run the splash kernel in the Pallas interpreter, which
      # works on any backend (slowly).
      splash_interpret=False,
      # One [d, 3d] matmul for query/key/value (params stay separate).
      fused_qkv=False,
      # Per-block rematerialization: "none", "full", "dots", "dots_no_batch".
      remat_policy="none",
      # ModernBERT (objective.name="modernbert"; HF ModernBertConfig names):
      # the sliding window in tokens (half on each side: a query sees keys
      # at most local_attention // 2 away), full attention at layers 0, n,
      # 2n, ... (n = global_attn_every_n_layers), rotary bases of the global
      # and the sliding-window layers, and a classifier's pooling ("cls" or
      # "mean" over real tokens).
      local_attention=128,
      global_attn_every_n_layers=3,
      global_rope_theta=160_000.0,
      local_rope_theta=10_000.0,
      classifier_pooling="cls",
      # Sentence embeddings (task kind "pairs", models.heads' embed role):
      # a text's vector is its tokens pooled ("mean" over real tokens or
      # "cls"), L2-normalised when embedding_normalize (sentence-
      # transformers' Pooling and Normalize modules). "": the model
      # declares no pooling of its own (an encoder that was never trained
      # as an embedding model; the embed head then takes the mean).
      embedding_pooling="",
      embedding_normalize=False,
  ))


def data_config() -> ml_collections.ConfigDict:
  """Input pipeline options. With no sources set, the embedded demo corpus is used.

  A source is ``[text:]GLOB`` (text files in google-research/bert layout: one
  sentence per line, blank line between documents; any ``tf.io.gfile`` path,
  e.g. ``gs://bucket/wiki/*.txt``), ``jsonl:GLOB`` or ``parquet:GLOB``
  (records, one document each, its text in field ``text_field``; prepared
  once into text files under ``prepared_dir``) or ``tfds:NAME[:SPLIT]`` (a
  prepared TFDS dataset under ``tfds_data_dir``, text in feature
  ``tfds_text_key``) or ``shards:DIR`` (pre-tokenized by ``python -m
  bert_jax.pretokenize``), with an optional mixing weight ``@W``. Several
  sources are separated by ``;``.
  """
  return ml_collections.ConfigDict(dict(
      # Training sources, e.g. "gs://b/wiki/*.txt@0.7;tfds:wikipedia/20230601.en:train@0.3".
      # Empty (and train_files empty): the demo corpus (CPython's bundled
      # documentation topics), written into the workdir.
      sources="",
      # Shorthand for simple configs: a text-file glob (or several,
      # comma-separated). Used only when `sources` is empty.
      train_files="",
      # Held-out sources (same syntax). Empty: hold out `eval_fraction` of the
      # training documents (chosen by a hash of their first line).
      # Sampling over several sources: 0 = by their @W weights; T > 0 = by
      # size, tempered: p_i proportional to (w_i * n_i) ** (1 / T), n_i the
      # bytes of source i (T = 1: by size; larger T: flatter). mmBERT's
      # exponents 0.7 / 0.5 / 0.3 are T = 1/0.7, 2, 1/0.3 (docs/recipes.md).
      source_temperature=0.0,
      eval_sources="",
      eval_files="",  # Shorthand, like train_files.
      eval_fraction=0.05,
      tfds_data_dir="",  # data_dir for tfds sources ("" = TFDS default).
      tfds_text_key="text",
      # jsonl: / parquet: sources: the field (column) holding a record's
      # text, one document per record, split into sentences at newlines and
      # sentence ends.
      text_field="text",
      # Where their text files are prepared (converted once, reused by
      # reruns and by other runs given the same dir, e.g. gs://b/prepared);
      # "" = WORKDIR/prepared.
      prepared_dir="",
      # Tokenizer: "sentencepiece" (a .model file), "wordpiece" (vocab.txt)
      # or "hf_json" (a Hugging Face tokenizer.json: byte-level BPE,
      # SentencePiece, WordPiece; trained here: a byte-level BPE with
      # RoBERTa's special tokens, cased whatever lower_case says).
      tokenizer_type="sentencepiece",
      tokenizer_path="",  # Empty: train one on the corpus, cached in workdir.
      # Size requested when a tokenizer is trained (the model's embedding
      # table may be larger than the tokenizer, never smaller). SentencePiece
      # is trained with hard_vocab_limit=False, so a small corpus gives fewer.
      tokenizer_vocab_size=8000,
      tokenizer_train_sentences=2_000_000,  # Lines read to train one.
      lower_case=True,
      seq_length=128,
      max_predictions_per_seq=20,
      mask_rate=0.15,
      mask_token_prob=0.8,  # Of the selected tokens: -> [MASK]
      random_token_prob=0.1,  # -> a random token (the rest stay unchanged).
      whole_word_mask=False,
      # Masked spans of up to max_ngram units (words with whole_word_mask,
      # else tokens), p(n) ~ 1/n, one 80/10/10 draw per span (ALBERT: 3).
      max_ngram=1,
      nsp=True,  # Whether batches carry a sentence-pair label (NSP or SOP).
      # "nsp" (BERT), "sop" (ALBERT sentence order), "packed" (RoBERTa full
      # sentences, no pair label). "" = "nsp" if nsp else "packed".
      objective="",
      short_seq_prob=0.1,
      # Packing (bert_jax/data/packing.py): several examples per row, each
      # attending only to itself, with its own positions and [CLS]: NSP/SOP
      # pairs, or with objective "packed" whole-document chunks (which then
      # never cross a document), or fine-tuning examples. Rows are filled by
      # best-fit decreasing over windows of packing_window examples, at most
      # packing_max_sequences a row (the static shape of the per-example
      # features). Off: one example per row, padded.
      packing=False,
      packing_max_sequences=16,
      packing_window=1024,
      # Lines per block: example building works on blocks of consecutive
      # lines of one file; NSP random segments come from the same block.
      block_lines=1024,
      max_line_bytes=65536,  # Longer lines are truncated (and counted).
      shuffle_buffer=4096,  # Examples; 0 = no shuffling.
      # shards: sources (bert_jax/data/shard_source.py): "global" reads
      # the blocks of all shards in a new pseudo-random order every epoch;
      # "files" in the text pipeline's order (shards permuted per epoch,
      # cycle_length of them interleaved: the batches of a run from the
      # text files).
      shard_order="global",
      cycle_length=8,  # Files read concurrently.
      num_eval_batches=8,
  ))


def sentence_objective(data: ml_collections.ConfigDict) -> str:
  """data.objective, with "" resolved from data.nsp."""
  obj = (data.objective or "").lower()
  return obj or (NSP if data.nsp else PACKED)


def objective_config() -> ml_collections.ConfigDict:
  """Which pluggable objective trains (`bert_jax/objectives/`), and every
  family's own fields, so that ``--config.objective.name=electra`` (or
  distil) works on any config with that family's published defaults."""
  return ml_collections.ConfigDict(dict(
      # Pretraining (bert_jax/families/): bert: MLM (+ NSP/SOP per
      # data.objective); albert: the same on the shared-layer ALBERT model;
      # electra: replaced-token detection; distil: DistilBERT distillation;
      # modernbert: ModernBERT's MLM; roberta, xlm-roberta: MLM alone on
      # RoBERTa's encoder. Fine-tuning sets its task kind's
      # (bert_jax/tasks/): classify, token_classify, span_qa.
      name="bert",
      # distil: the teacher (our workdir, an imported or Hugging Face BERT
      # dir; "random" = random init, tests only); config.model is its
      # architecture, the student has student_layers layers.
      teacher="",
      student_layers=6,
      temperature=2.0,  # distil: of the soft targets.
      alpha_ce=5.0,  # Published DistilBERT weights (Sanh et al. 2019).
      alpha_mlm=2.0,
      alpha_cos=1.0,
      # electra (google-research/electra configure_pretraining.py): the
      # generator's size as a fraction of the discriminator's hidden size
      # (0.25 ELECTRA-Small, 1/3 Base and Large) and of its depth.
      generator_hidden_size=0.25,
      generator_layers=1.0,
      # 0 = as google-research/electra: max(1, hidden // 64) heads and a
      # 4 x hidden FFN. Set to match a generator imported from HF.
      generator_num_attention_heads=0,
      generator_intermediate_size=0,
      generator_temperature=1.0,  # Of the generator's sampling softmax.
      gen_weight=1.0,  # MLM (generator) loss weight.
      disc_weight=50.0,  # Replaced-token-detection loss weight.
      # Fine-tuning objectives: the family whose encoder carries the task
      # head (bert, albert, electra, distilbert, modernbert, roberta,
      # xlm-roberta; set from train.init_from): the head's layout and
      # Hugging Face class follow it.
      encoder="bert",
      # Sentence embeddings (objective "embed", task kind "pairs"; see
      # bert_jax/tasks/pair_losses.py): "infonce" (in-batch negatives over
      # the whole global batch, sentence-transformers'
      # MultipleNegativesRankingLoss) or "cosent" (CoSENT on scored
      # pairs); the scale multiplying cosine similarities (1 /
      # temperature); InfoNCE both ways (anchors -> positives and back);
      # the Matryoshka prefixes the loss is summed over (e.g. (768, 256,
      # 64); () = the whole vector).
      pair_loss="infonce",
      pair_scale=20.0,
      pair_symmetric=False,
      matryoshka_dims=(),
  ))


def train_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      num_steps=1000,
      batch_size=32,  # Global, across all hosts and devices.
      learning_rate=1e-4,
      warmup_steps=100,
      weight_decay=0.01,
      adam_b1=0.9,
      adam_b2=0.999,
      adam_eps=1e-6,
      max_grad_norm=1.0,  # Global-norm clipping (not stable_adamw's).
      # "adamw", "lamb", or "stable_adamw": AdamW with per-tensor update
      # clipping (Wortsman et al. 2023) instead of global-norm clipping.
      optimizer="adamw",
      # Learning-rate shape: "linear" (warmup, then linear decay to 0 at the
      # end) or "wsd" (warmup, constant, then decay to 0 over the last
      # decay_steps, linearly or with decay_shape "1-sqrt").
      schedule="linear",
      decay_steps=0,
      decay_shape="linear",
      grad_accum_steps=1,
      # Objectives whose loss is a function of per-example vectors (a
      # bi-encoder, objectives.Objective.split): > 0 takes the cached-
      # gradient step (training/cached_gradients.py), embedding the batch
      # this many examples at a time, so only one chunk's activations are
      # ever kept. 0: the plain step.
      cache_chunk_size=0,
      log_every=10,
      eval_every=100,
      seed=0,
      # A step whose loss or gradient is NaN/Inf never updates the weights.
      # "skip": drop it and go on, stopping after max_nonfinite_in_a_row
      # such steps in a row; "stop": stop at the first, naming the step.
      nonfinite_policy="skip",
      max_nonfinite_in_a_row=10,
      # Start a new run from pretrained params only (fresh optimizer, step 0):
      # one of our workdirs (or its checkpoints/<step> dir), a Hugging Face
      # dir or a tools/convert_from_hf.py output. Used only when the workdir
      # has no checkpoint yet; a resumed run continues from its own.
      init_from="",
      # Per-device peak TFLOP/s for MFU; 0: spec sheet, else measured at
      # startup with a 2048^3 matmul (seconds on a CPU).
      peak_tflops=0.0,
      # Phases of one run with their own batch shapes (bert_jax/training/phases.py):
      # a tuple of dicts with num_steps, seq_length, max_predictions_per_seq,
      # batch_size (+ optional learning_rate, warmup_steps, "data": fields of
      # PHASE_DATA_FIELDS, "model": PHASE_MODEL_FIELDS, ...), adding up to
      # num_steps. Empty: one phase of the data/train shapes.
      phases=(),
      # "bert_two_phase": 90% of num_steps at seq 128 / 20 predictions, the
      # rest at 512 / 80, same batch (Devlin et al. 2019). "" = phases above.
      recipe="",
      # The global batch grows over the first phase's first `tokens` tokens
      # (batch x seq_length): start, start + increment, ... (below the
      # phase's batch_size), an equal number of steps each, then batch_size
      # (ModernBERT: 768 -> 4,608 over 50B tokens). start 0: no warm-up.
      # A phase's "batch_warmup" entry sets its own (docs/recipes.md).
      batch_warmup=dict(start=0, increment=0, tokens=0.0),
      # What the learning-rate schedule counts: "steps" (warmup_steps,
      # decay_steps, num_steps) or "tokens" (warmup_tokens, decay_tokens and
      # the run's tokens, batch x seq_length per step), so that a growing
      # batch does not stretch the schedule.
      schedule_unit="steps",
      warmup_tokens=0.0,  # Floats so that 3e9 overrides them; whole numbers.
      decay_tokens=0.0,
      # An exponential moving average of the params in the train state
      # (state["ema"], checkpointed; 0: none): after every applied update
      # ema = d * ema + (1 - d) * params. `python -m bert_jax.average --ema`
      # writes a step's average as a workdir.
      ema_decay=0.0,
      # "per_phase": each phase warms up and decays on its own (NVIDIA's
      # recipe); "continuous": one schedule over all steps (google-research).
      phase_schedule="per_phase",
      # Where a later phase's data starts: "reshuffle" (the pipeline again
      # with a seed of its own; free) or "continue" (after the examples
      # already consumed; the skip re-reads them). bert_jax/training/phases.py.
      phase_data="reshuffle",
  ))


def mesh_config() -> ml_collections.ConfigDict:
  """Device mesh; -1 on one axis takes all remaining devices.

  data: batch split, params replicated. fsdp: batch split, params and
  optimizer state split too (gathered per layer). tensor: heads, MLP and
  vocab split (Megatron style). E.g. 8 devices: data=-1 (DP 8), or
  data=1 fsdp=-1 (FSDP 8), or data=-1 tensor=2 (DP 4 x TP 2).
  """
  return ml_collections.ConfigDict(dict(
      data=-1,
      fsdp=1,
      tensor=1,
      # Multi-slice (DCN): slices along each axis; the axes above then give
      # the layout within one slice, and e.g. data=-1 dcn_data=2 is data
      # parallel over 2 slices x all chips of a slice. Without TPU slices
      # (GPU hosts) processes play the role of slices.
      dcn_data=1,
      dcn_fsdp=1,
      dcn_tensor=1,
      # Logical axis name -> mesh axis (or None: replicated). One table for
      # parameters and activations; changing parallelism is a config change.
      rules=[
          ("activation_batch", ("data", "fsdp")),
          ("activation_length", None),
          ("activation_embed", None),
          ("activation_mlp", "tensor"),
          ("activation_heads", "tensor"),
          ("activation_vocab", "tensor"),
          ("embed", "fsdp"),
          ("mlp", "tensor"),
          ("heads", "tensor"),
          ("kv", None),
          ("vocab", "tensor"),
          ("norm", None),
          ("position", None),
          ("type", None),
          ("classes", None),
      ],
  ))


def checkpoint_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      save_every_steps=500,  # Also saved at the end and on preemption.
      max_to_keep=3,  # The newest N are kept...
      keep_period=0,  # ...plus, forever, steps that are multiples of this (0: none).
      async_save=True,  # Write in a background thread while training goes on.
  ))


def get_config(size: str = "base") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.objective = objective_config()
  config.model = model_config(size)
  config.data = data_config()
  config.train = train_config()
  config.mesh = mesh_config()
  config.checkpoint = checkpoint_config()
  return config


def complete(partial, size: str = "base") -> ml_collections.ConfigDict:
  """A full config: the defaults overlaid with `partial` (a dict or
  ConfigDict, e.g. a checkpoint's stored config). Groups or fields missing
  from `partial` take the defaults; groups the defaults lack
  (a fine-tuning run's ``task``) are kept as stored."""
  config = get_config(size)
  as_dict = lambda x: x.to_dict() if hasattr(x, "to_dict") else x
  partial = as_dict(partial) or {}
  for group, fields in partial.items():
    fields = as_dict(fields)
    if group not in config:
      config[group] = fields
    elif isinstance(fields, dict):
      for key, value in fields.items():
        config[group][key] = value
  objective = as_dict(partial.get("objective")) or {}
  if (objective.get("name") == "electra" and "temperature" in objective
      and "generator_temperature" not in objective):
    # An ELECTRA config without generator_temperature holds the
    # generator's sampling temperature as objective.temperature.
    config.objective.generator_temperature = objective["temperature"]
    config.objective.temperature = objective_config().temperature
  # Fine-tuning run configs that name the head by family and kind in one
  # name, or the encoder by its pretraining objective.
  name, encoder = FAMILY_HEADS.get(config.objective.name,
                                   (config.objective.name,
                                    config.objective.encoder))
  config.objective.name = name
  config.objective.encoder = OBJECTIVE_FAMILIES.get(encoder, encoder)
  return config


# objective.name -> (task objective, objective.encoder) of the names that
# held both; objective.encoder given as a pretraining objective -> family.
FAMILY_HEADS = {"modernbert_classify": ("classify", "modernbert"),
                "modernbert_token_classify": ("token_classify", "modernbert"),
                "modernbert_span_qa": ("span_qa", "modernbert")}
OBJECTIVE_FAMILIES = {"distil": "distilbert"}


# Model fields a phase of train.phases may change (its "model" entry): they
# change the function, not the parameters, so the train state carries over
# (e.g. a context-extension phase with a larger global RoPE base).
PHASE_MODEL_FIELDS = ("global_rope_theta", "local_rope_theta",
                      "local_attention", "attention_impl", "remat_policy")


# Data fields a phase of train.phases may change (its "data" entry): how
# batches are masked and which sources, mixed how, feed them; not the
# features a batch holds (packing, the sentence objective, the tokenizer) nor
# the held-out data every phase is evaluated on.
PHASE_DATA_FIELDS = ("mask_rate", "mask_token_prob", "random_token_prob",
                     "whole_word_mask", "max_ngram", "short_seq_prob",
                     "sources", "source_temperature", "shuffle_buffer")


def phase_model_overrides(config, step: int | None) -> dict:
  """The "model" entry of the train.phases phase that ran step index
  `step` - 1 (the phase a checkpoint at `step` was saved in; None: the
  last phase). {} for runs without phases or overrides."""
  train = config.get("train", None) if config is not None else None
  phases = list((train or {}).get("phases", None) or ())
  as_dict = lambda x: dict(x.to_dict() if hasattr(x, "to_dict") else x)
  start = 0
  for i, spec in enumerate(phases):
    spec = as_dict(spec)
    start += int(spec.get("num_steps", 0))
    if step is None and i < len(phases) - 1:
      continue
    if step is None or max(int(step) - 1, 0) < start or i == len(phases) - 1:
      return as_dict(spec.get("model", None) or {})
  return {}


def complete_model(partial) -> ml_collections.ConfigDict:
  """A full `model` group from a partial one (defaults for missing fields)."""
  return complete({"model": partial}).model
