"""Tiny random BERTs written as Hugging Face directories, for downstream tests.

A hand-written WordPiece vocabulary (no tokenizer training) keeps a fixture
to a second; `mlm_bias` lets a test choose which tokens the head favours.
"""

import os

import numpy as np

WORDS = (
    "the a an it was is this that movie film story plot acting and but not "
    "very really quite great terrible good bad fine awful nice boring fun "
    "i we you they he she loved hated liked saw watched river bank account "
    "money water walked along opened deposited cash in my our of to on at "
    "for with about day night long short wonder question answer yes no "
    "did does do what who why how , . ! ?").split()
PIECES = ("##ful", "##s", "##ed", "##ing", "##ly")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_vocab(path: str) -> list[str]:
  vocab = list(SPECIALS) + sorted(set(WORDS)) + list(PIECES)
  with open(path, "w") as f:
    f.write("\n".join(vocab) + "\n")
  return vocab


def tiny_model_config(vocab_size: int, max_position_embeddings: int = 64):
  from bert_jax import config_lib
  config = config_lib.get_config("tiny")
  config.data.tokenizer_type = "wordpiece"
  config.model.update(vocab_size=vocab_size, hidden_size=64,
                      num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128,
                      max_position_embeddings=max_position_embeddings)
  return config


def make_hf_dir(base: str, *, seed: int = 0, mlm_bias_scale: float = 2.0,
                neutral_words=()):
  """A random 2x64 BERT + WordPiece vocab exported to `base`/hf.

  The MLM bias is random (a peaked distribution, no near-ties) except for
  `neutral_words`, whose bias is 0 so the context decides between them.
  Returns dict(out, vocab_path, params, config).
  """
  from flax import nnx

  from bert_jax.families import bert as bert_family
  from bert_jax.hf import checkpoint_io
  from bert_jax.hf import mapping
  from bert_jax.hf import tokenizer_files
  from bert_jax.models import bert as bert_model
  os.makedirs(base, exist_ok=True)
  vocab_path = os.path.join(base, "vocab.txt")
  vocab = write_vocab(vocab_path)
  config = tiny_model_config(len(vocab))
  config.data.tokenizer_path = vocab_path
  m = bert_model.BertForPreTraining(config.model, rngs=nnx.Rngs(seed))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  flat = {k: np.asarray(v, np.float32) for k, v in flat.items()}
  bias = np.random.default_rng(seed).normal(
      0, mlm_bias_scale, flat["mlm_head.bias"].shape).astype(np.float32)
  for w in neutral_words:
    bias[vocab.index(w)] = 0.0
  flat["mlm_head.bias"] = bias
  params = mapping.unflatten_params(flat)
  out = os.path.join(base, "hf")
  checkpoint_io.save_hf_model(
      out, params, config.model, table=bert_family.BERT,
      tokenizer=tokenizer_files.TokenizerSpec("wordpiece", vocab_path, True))
  return dict(out=out, vocab_path=vocab_path, params=params, config=config)


def strip_mlm_head(src: str, dst: str) -> None:
  """Copy an HF dir, keeping only BertModel weights (no cls.* heads)."""
  import json
  import shutil

  from safetensors.numpy import load_file
  from safetensors.numpy import save_file
  shutil.copytree(src, dst)
  sd = load_file(os.path.join(src, "model.safetensors"))
  save_file({k[len("bert."):]: v for k, v in sd.items()
             if k.startswith("bert.")},
            os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(dst, "config.json")) as f:
    cfg = json.load(f)
  cfg["architectures"] = ["BertModel"]
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f)


# -----------------------------------------------------------------------------
# A learnable fine-tuning task: the label is which keyword the sentence holds.
# -----------------------------------------------------------------------------
POSITIVE = ("great", "good", "nice", "fun")
NEGATIVE = ("terrible", "bad", "awful", "boring")
FILLER = ("the a it was this movie film story plot acting and very really "
          "quite i we saw watched").split()


def keyword_rows(n: int, seed: int, regression: bool = False):
  """[(text, label)]: "pos"/"neg" by keyword, or (regression) the number of
  positive keywords minus the negative ones, as a float string."""
  import random
  r = random.Random(seed)
  out = []
  for _ in range(n):
    words = [r.choice(FILLER) for _ in range(r.randint(3, 12))]
    label = r.randint(0, 1)
    words.insert(r.randint(0, len(words)),
                 r.choice(POSITIVE if label else NEGATIVE))
    if regression:
      extra = r.choice(POSITIVE + NEGATIVE)
      words.append(extra)
      score = label * 2 - 1 + (1 if extra in POSITIVE else -1)
      out.append((" ".join(words), f"{score / 2:.1f}"))
    else:
      out.append((" ".join(words), "pos" if label else "neg"))
  return out


def write_keyword_task(directory: str, n_train: int = 512, n_dev: int = 64,
                       regression: bool = False) -> tuple[str, str]:
  """train.csv and dev.csv (columns text, label) in `directory`."""
  import csv
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
    path = os.path.join(directory, f"{name}.csv")
    with open(path, "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["text", "label"])
      w.writerows(keyword_rows(n, seed, regression))
    paths.append(path)
  return paths[0], paths[1]


def finetune_config(init_from: str, train_file: str, dev_file: str, *,
                    num_steps: int = 40, regression: bool = False,
                    learning_rate: float = 1e-3):
  """configs/finetune.py on the keyword task, tiny-run sized."""
  from tests import helpers
  config = helpers.load_config("finetune")
  config.task.update(name="kw", train_file=train_file,
                     validation_file=dev_file, text_field="text",
                     regression=regression)
  config.train.update(init_from=init_from, learning_rate=learning_rate,
                      batch_size=16, num_steps=num_steps)
  config.data.seq_length = 32
  config.model.dtype = "float32"
  return config


# -----------------------------------------------------------------------------
# A Hugging Face ModernBERT directory whose only tokenizer is a byte-level BPE
# tokenizer.json (as answerdotai/ModernBERT-base ships), trained here.
# -----------------------------------------------------------------------------
BPE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def make_byte_level_modernbert_dir(base: str, bpe_size: int = 320) -> dict:
  """`base`/hf: a byte-level BPE tokenizer.json trained on a few sentences
  (the 256 byte tokens, 5 specials and merges up to `bpe_size`) and random
  params of the tests' tiny ModernBERT
  (`family_checks.family_config("modernbert")`) with one embedding row per
  token; `base`/vocab.txt: that vocabulary as a WordPiece vocab.txt (the
  same tokens, in id order). Returns dict(out, vocab_path, config)."""
  import jax
  from flax import nnx
  from tokenizers import Tokenizer
  from tokenizers import decoders
  from tokenizers import models
  from tokenizers import pre_tokenizers
  from tokenizers import trainers

  from bert_jax.families import modernbert as modernbert_family
  from bert_jax.hf import checkpoint_io
  from tests.helpers import family_checks
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(
      [" ".join(WORDS), "john smith visited paris", "The quick brown fox."] * 4,
      trainers.BpeTrainer(vocab_size=bpe_size, special_tokens=list(
          BPE_SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  config = family_checks.family_config("modernbert")
  config.model.vocab_size = tok.get_vocab_size()
  make = modernbert_family.MODERNBERT.make_model
  params = jax.device_get(jax.jit(lambda: nnx.to_pure_dict(nnx.state(
      make(config.model, nnx.Rngs(0)), nnx.Param)))())
  out = os.path.join(base, "hf")
  checkpoint_io.save_hf_model(out, params, config.model,
                              table=modernbert_family.MODERNBERT)
  tok.save(os.path.join(out, "tokenizer.json"))
  vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
  vocab_path = os.path.join(base, "vocab.txt")
  with open(vocab_path, "w", encoding="utf-8") as f:
    f.write("".join(token + "\n" for token, _ in vocab))
  return dict(out=out, vocab_path=vocab_path, config=config)


# -----------------------------------------------------------------------------
# Sentence embeddings: a tiny random encoder on a real vocabulary, and real
# pairs as BEIR retrieval files.
# -----------------------------------------------------------------------------
def make_embedding_dir(base: str, *, pooling: str = "mean",
                       normalize: bool = False, seed: int = 7) -> str:
  """A random 2x64 BERT on MiniLM's WordPiece vocabulary (real English
  text tokenizes), exported as a sentence-transformers directory; returns
  its path."""
  from flax import nnx

  from bert_jax import compose
  from bert_jax import config_lib
  from bert_jax import export
  from bert_jax.hf import tokenizer_files
  from tests.helpers.checkpoints import minilm_dir
  config = config_lib.get_config("tiny")
  config.objective.update(name="embed", encoder="bert")
  config.model.update(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128,
                      max_position_embeddings=64, embedding_pooling=pooling,
                      embedding_normalize=normalize)
  config.data.seq_length = 64
  model = compose.objective(config).make_model(config, nnx.Rngs(seed))
  out = os.path.join(base, "embedding")
  export.write_hf_models(
      out, nnx.to_pure_dict(nnx.state(model, nnx.Param)), config,
      tokenizer=tokenizer_files.TokenizerSpec(
          "wordpiece", os.path.join(minilm_dir(), "vocab.txt"), True))
  return out


def write_beir_from_pairs(directory: str, pairs_tsv: str, first: str,
                          second: str, label: str) -> str:
  """BEIR files from a paraphrase TSV: every second sentence a document,
  the first sentence of each paraphrase (label 1) a query judging its
  pair's document relevant."""
  import csv
  import json
  with open(pairs_tsv, newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  os.makedirs(os.path.join(directory, "qrels"), exist_ok=True)
  with open(os.path.join(directory, "corpus.jsonl"), "w") as f:
    for i, r in enumerate(rows):
      f.write(json.dumps({"_id": f"d{i}", "title": "",
                          "text": r[second]}) + "\n")
  with open(os.path.join(directory, "queries.jsonl"), "w") as q, open(
      os.path.join(directory, "qrels", "test.tsv"), "w") as j:
    j.write("query-id\tcorpus-id\tscore\n")
    for i, r in enumerate(rows):
      if r[label] == "1":
        q.write(json.dumps({"_id": f"q{i}", "text": r[first]}) + "\n")
        j.write(f"q{i}\td{i}\t1\n")
  return directory
