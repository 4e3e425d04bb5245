"""The tokenizers of a run: SentencePiece and WordPiece in the tf.data graph,
and any Hugging Face tokenizer.json (``hf_json_tokenizer``).

All present one interface (``tokenizer_base.Tokenizer``): special-token
ids, the vocabulary size, a ``tokenize`` inside the graph (strings ->
ragged int32 ids), a per-id ``word_start`` table for whole-word masking, and
Python-side ``encode``/``decode`` for tools and tests.

* SentencePiece: a ``.model`` file, run with ``tf_text.FastSentencepieceTokenizer``.
  Models trained here have ``[PAD]``=0, ``[UNK]``=1 and the user-defined
  symbols ``[CLS]``=2, ``[SEP]``=3, ``[MASK]``=4; lower-casing is part of the
  model's normalizer (``nmt_nfkc_cf``), so it travels with the file.
* WordPiece: a BERT ``vocab.txt`` (e.g. bert-base-uncased's 30,522 entries,
  used unchanged), run with ``tf_text.FastBertTokenizer``; special tokens are
  looked up by name.
* hf_json: a ``tokenizer.json`` (byte-level BPE, SentencePiece, WordPiece),
  run host-side by the ``tokenizers`` library; trained here, a byte-level
  BPE with RoBERTa's special tokens.

:func:`load_tokenizer` gives a run its configured tokenizer: the file at
``data.tokenizer_path``, or one trained on the run's training sources and
cached in the workdir (:func:`cache_path`).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import time
from typing import (TYPE_CHECKING, Iterable, Iterator,
                    Optional, Sequence)

import jax
import ml_collections
import numpy as np
import sentencepiece as spm
import tokenizers as hf_tok
from absl import logging
from jax.experimental import multihost_utils
from sentencepiece import sentencepiece_model_pb2 as pb
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import trainers

from bert_jax.data import hf_json_tokenizer
from bert_jax.data.tokenizer_base import Pieces
from bert_jax.data.tokenizer_base import Tokenizer
from bert_jax.data.tokenizer_base import char_pieces

# TensorFlow is imported where a function needs it: SPECIAL_TOKENS and the
# names here are read by TF-free code (Hugging Face export, fill_mask).
if TYPE_CHECKING:
  import tensorflow as tf

  from bert_jax.data import sources as data_sources


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SENTENCEPIECE = "sentencepiece"
WORDPIECE = "wordpiece"
HF_JSON = hf_json_tokenizer.HF_JSON
KINDS = (SENTENCEPIECE, WORDPIECE, HF_JSON)


class SentencePieceTokenizer(Tokenizer):
  kind = SENTENCEPIECE

  def __init__(self, model_proto: bytes, path: str = ""):
    import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
    self.path = path
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._sp.get_piece_size()
    self.pieces = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
    self._init_specials()
    self._tf = tf_text.FastSentencepieceTokenizer(model_proto)
    self.lower_case = "_cf" in self._normalizer_name()

  def _normalizer_name(self) -> str:
    m = pb.ModelProto()
    m.ParseFromString(self.model_proto)
    return m.normalizer_spec.name

  @property
  def word_start(self) -> np.ndarray:
    ws = np.array([p.startswith("\u2581") for p in self.pieces])
    ws[self.special_ids] = True
    for i in range(self.vocab_size):  # control / user-defined / unknown pieces
      if self._sp.is_control(i) or self._sp.is_unknown(i):
        ws[i] = True
    return ws

  def tokenize(self, lines: tf.Tensor) -> tf.RaggedTensor:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.cast(self._tf.tokenize(lines), tf.int32)

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def tokenize_with_offsets(self, texts: Sequence[str]) -> list[Pieces]:
    out = []
    for text, proto in zip(texts, self._sp.encode(list(texts),
                                                  return_type="proto")):
      p = proto.pieces
      out.append(char_pieces(text, [x.id for x in p], [x.begin for x in p],
                              [x.end for x in p], strip=True))
    return out

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids if int(i) != self.pad_id]
    out, run = [], []
    for i in ids:  # keep special pieces visible, as in "[CLS] a b [SEP]"
      if i in (self.cls_id, self.sep_id, self.mask_id):
        if run:
          out.append(self._sp.decode(run))
          run = []
        out.append(self.pieces[i])
      else:
        run.append(i)
    if run:
      out.append(self._sp.decode(run))
    return " ".join(out)


class WordPieceTokenizer(Tokenizer):
  kind = WORDPIECE

  def __init__(self, vocab: Sequence[str], lower_case: bool, path: str = ""):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
    self.path = path
    self.pieces = list(vocab)
    self.vocab_size = len(self.pieces)
    self.lower_case = lower_case
    self._init_specials()
    self._tf = tf_text.FastBertTokenizer(
        vocab=self.pieces, token_out_type=tf.int32,
        unknown_token="[UNK]" if self.unk_id is not None else None,
        lower_case_nfd_strip_accents=lower_case)

  @property
  def word_start(self) -> np.ndarray:
    ws = np.array([not p.startswith("##") for p in self.pieces])
    ws[self.special_ids] = True
    return ws

  def tokenize(self, lines: tf.Tensor) -> tf.RaggedTensor:
    ids = self._tf.tokenize(lines)  # [N, pieces]
    if ids.shape.rank == 3:  # older tf_text: [N, words, pieces]
      ids = ids.merge_dims(-2, -1)
    return ids

  def tokenize_with_offsets(self, texts: Sequence[str]) -> list[Pieces]:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if not texts:
      return []
    ids, starts, ends = self._tf.tokenize_with_offsets(tf.constant(
        list(texts), tf.string))
    if ids.shape.rank == 3:  # older tf_text: [N, words, pieces]
      ids, starts, ends = (x.merge_dims(-2, -1) for x in (ids, starts, ends))
    return [char_pieces(t, i, b, e) for t, i, b, e in zip(
        texts, ids.to_list(), starts.to_list(), ends.to_list())]

  def decode(self, ids: Iterable[int]) -> str:
    toks = [self.pieces[int(i)] for i in ids if int(i) != self.pad_id]
    return " ".join(toks).replace(" ##", "")


def load(path: str, kind: str, lower_case: bool = True) -> Tokenizer:
  """Loads a tokenizer file (any tf.io.gfile path)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.exists(path):
    raise ValueError(f"data.tokenizer_path={path!r} does not exist.")
  if kind == SENTENCEPIECE:
    with tf.io.gfile.GFile(path, "rb") as f:
      proto = f.read()
    what = "is empty (0 bytes)" if not proto else (
        "is not a readable SentencePiece model (truncated, damaged or "
        "another kind of file)")
    fix = ("; point data.tokenizer_path at a .model file written by "
           "SentencePiece (or tools/train_tokenizer.py), or set "
           "data.tokenizer_type='wordpiece' for a vocab.txt.")
    if not proto:  # SentencePiece loads 0 bytes as a model of no pieces.
      raise ValueError(f"{path} {what}: not a SentencePiece model{fix}")
    try:
      tok = SentencePieceTokenizer(proto, path=path)
    except Exception as e:  # pylint: disable=broad-except
      # A truncated or foreign file fails deep in SentencePiece / tf_text.
      raise ValueError(f"{path} {what}{fix}") from e
    if not tok.vocab_size:
      raise ValueError(f"{path} {what}: it holds no pieces{fix}")
    return tok
  if kind == WORDPIECE:
    with tf.io.gfile.GFile(path, "r") as f:
      vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    while vocab and not vocab[-1]:
      vocab.pop()
    if not vocab:
      raise ValueError(f"WordPiece vocabulary {path!r} is empty.")
    return WordPieceTokenizer(vocab, lower_case=lower_case, path=path)
  if kind == HF_JSON:
    beside = os.path.join(os.path.dirname(path), hf_json_tokenizer.CONFIG_FILE)
    with tf.io.gfile.GFile(path, "r") as f:
      text = f.read()
    config = None
    if tf.io.gfile.exists(beside):
      with tf.io.gfile.GFile(beside, "r") as f:
        config = f.read()
    return hf_json_tokenizer.load(path, text, config)
  raise ValueError(_kind_error(kind))


def _kind_error(kind: str) -> str:
  return (f"data.tokenizer_type={kind!r} must be one of "
          f"{', '.join(map(repr, KINDS))}.")


# -----------------------------------------------------------------------------
# Training.
# -----------------------------------------------------------------------------


def train_sentencepiece(sentences: Iterator[str], vocab_size: int,
                        lower_case: bool = True,
                        model_type: str = "unigram",
                        max_line_bytes: int = 16384) -> bytes:
  """Trains a SentencePiece model; returns the serialized model proto.

  ``hard_vocab_limit=False``: a small corpus yields fewer pieces than asked.
  SentencePiece silently drops sentences over ``max_sentence_length`` bytes;
  it is set above ``max_line_bytes`` (the cut of :func:`training_sentences`,
  plus the bytes of a replaced partial character) so none is dropped.
  """
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=sentences,
      model_writer=buf,
      vocab_size=vocab_size,
      model_type=model_type,
      hard_vocab_limit=False,
      character_coverage=0.9995,
      pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
      pad_piece="[PAD]", unk_piece="[UNK]",
      user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
      normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
      max_sentence_length=max(16384, int(max_line_bytes) + 8),
      shuffle_input_sentence=True,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
  )
  return buf.getvalue()


def train_wordpiece(sentences: Iterator[str], vocab_size: int,
                    lower_case: bool = True) -> list[str]:
  """Trains a BERT WordPiece vocabulary (with the ``tokenizers`` library).

  Returns the vocabulary in id order: [PAD], [UNK], [CLS], [SEP], [MASK], ...
  """
  tok = hf_tok.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(
      lowercase=lower_case, strip_accents=lower_case, clean_text=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
      show_progress=False)
  tok.train_from_iterator(sentences, trainer=trainer)
  vocab = tok.get_vocab()
  return [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def save_wordpiece(vocab: Sequence[str], path: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("".join(p + "\n" for p in vocab))


def write_atomic(path: str, data: bytes) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tmp = f"{path}.tmp{os.getpid()}"
  with tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def default_filename(kind: str) -> str:
  return {SENTENCEPIECE: "spm.model", HF_JSON: "tokenizer.json"}.get(
      kind, "vocab.txt")


def train(kind: str, sentences: Iterator[str], vocab_size: int,
          lower_case: bool, path: str, max_line_bytes: int = 16384
          ) -> Tokenizer:
  """Trains a tokenizer of ``kind`` and writes it (atomically) to ``path``.

  The first sentence is read before anything else happens, so an unusable
  corpus (:func:`training_sentences` raises) writes nothing.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  sentences = iter(sentences)
  first = next(sentences, None)
  if first is None:
    raise ValueError("No sentences to train a tokenizer on.")
  sentences = itertools.chain([first], sentences)
  if kind == SENTENCEPIECE:
    data = train_sentencepiece(sentences, vocab_size, lower_case,
                               max_line_bytes=max_line_bytes)
  elif kind == WORDPIECE:
    vocab = train_wordpiece(sentences, vocab_size, lower_case)
    data = "".join(p + "\n" for p in vocab).encode("utf-8")
  elif kind == HF_JSON:
    text, tok_config = hf_json_tokenizer.train_byte_level_bpe(sentences,
                                                             vocab_size)
    data = text.encode("utf-8")
  else:
    raise ValueError(_kind_error(kind))
  tf.io.gfile.makedirs(os.path.dirname(path) or ".")
  if kind == HF_JSON:  # Its special tokens' names, beside it.
    write_atomic(os.path.join(os.path.dirname(path),
                              hf_json_tokenizer.CONFIG_FILE),
                 json.dumps(tok_config, indent=2).encode("utf-8"))
  write_atomic(path, data)
  return load(path, kind, lower_case)


def maybe_none(x: Optional[int]) -> int:
  return -1 if x is None else int(x)


# -----------------------------------------------------------------------------
# The configured tokenizer of a run (trained and cached when none is given).
# -----------------------------------------------------------------------------


def cache_path(data: ml_collections.ConfigDict, workdir: str,
               plan: Optional[data_sources.SourcePlan] = None) -> str:
  """Where load_tokenizer caches a tokenizer trained for this data config.

  ``workdir/tokenizer/<type>-<vocab size>-<case>-<hash of the train sources>/``
  so a change of sources, size or casing trains a new one.
  """
  from bert_jax.data import (
    sources as data_sources,  # TensorFlow's gfile: when training.
  )
  plan = plan or data_sources.plan(data, workdir)
  sources = ("demo" if plan.uses_demo else
             ";".join(str(s) for s in plan.train))
  digest = hashlib.sha256(sources.encode()).hexdigest()[:8]
  # A byte-level BPE trained here keeps case whatever lower_case says.
  case = ("uncased" if data.lower_case and data.tokenizer_type != HF_JSON
          else "cased")
  name = f"{data.tokenizer_type}-{data.tokenizer_vocab_size}-{case}-{digest}"
  return os.path.join(workdir, "tokenizer", name,
                      default_filename(data.tokenizer_type))


def training_sentences(data: ml_collections.ConfigDict, workdir: Optional[str],
                       limit: Optional[int] = None,
                       plan: Optional[data_sources.SourcePlan] = None
                       ) -> Iterator[str]:
  """Lines of the training sources for tokenizer training, weight-shared.

  Cleaned as the pipeline cleans them: cut to ``data.max_line_bytes``, blank
  lines skipped. Checked before it returns (so before a tokenizer is
  trained or anything written): a binary source, or sources where every line
  is blank, raise ValueError naming them.
  """
  limit = limit or int(data.get("tokenizer_train_sentences", 2_000_000))
  max_line_bytes = int(data.get("max_line_bytes", 65536))
  from bert_jax.data import (
    sources as data_sources,  # TensorFlow's gfile: when training.
  )
  plan = plan or data_sources.plan(data, workdir)
  total = sum(s.weight for s in plan.train)
  field = "data.sources" if data.get("sources", "") else "data.train_files"
  for s in plan.train:  # Binary input: stop before reading millions of lines.
    data_sources.check_usable(s, max_line_bytes, field)
  lines = itertools.chain.from_iterable(
      data_sources.python_lines(
          s, data.get("tfds_data_dir", ""), data.get("tfds_text_key", "text"),
          limit=max(1, int(limit * s.weight / total)),
          max_line_bytes=max_line_bytes)
      for s in plan.train)
  first = next(lines, None)
  if first is None:
    raise ValueError(
        "No text to train a tokenizer on: every line of "
        f"{'; '.join(str(s) for s in plan.train)} is blank. Point "
        "data.sources at text files with one sentence per line, or set "
        "data.tokenizer_path to an existing tokenizer.")
  return itertools.chain([first], lines)


def load_tokenizer(data: ml_collections.ConfigDict,
                   workdir: Optional[str]) -> Tokenizer:
  """The configured tokenizer; trains and caches one when none is given.

  With ``data.tokenizer_path`` empty, a ``data.tokenizer_type`` tokenizer of
  ``data.tokenizer_vocab_size`` is trained on the training sources and cached
  at :func:`cache_path`. In a multi-process run only process 0 trains; the
  others wait for its outcome (a broadcast: they stop with it if it fails).
  """
  if data.tokenizer_type not in KINDS:
    raise ValueError(_kind_error(data.tokenizer_type))
  if data.tokenizer_path:
    return load(data.tokenizer_path, data.tokenizer_type, data.lower_case)
  if not workdir:
    raise ValueError("data.tokenizer_path is empty and there is no workdir to "
                     "cache a trained tokenizer in.")
  if data.tokenizer_vocab_size < 16:
    raise ValueError(f"data.tokenizer_vocab_size={data.tokenizer_vocab_size} "
                     "is too small (need >= 16).")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from bert_jax.data import (
    sources as data_sources,  # TensorFlow's gfile: when training.
  )
  plan = data_sources.plan(data, workdir)
  path = cache_path(data, workdir, plan)
  if not tf.io.gfile.exists(path):
    error = None
    if jax.process_index() == 0:
      try:
        sentences = training_sentences(data, workdir, plan=plan)  # checks 1st
        logging.info("Training a %s tokenizer (vocab %d) into %s",
                     data.tokenizer_type, data.tokenizer_vocab_size, path)
        t0 = time.time()
        train(data.tokenizer_type, sentences, data.tokenizer_vocab_size,
              data.lower_case, path, max_line_bytes=int(data.max_line_bytes))
        logging.info("Tokenizer trained in %.1fs.", time.time() - t0)
      except Exception as e:  # pylint: disable=broad-except
        error = e  # Raised below, after the others have heard of it.
    # The others wait for process 0's outcome, not for a file that a failed
    # process 0 never writes.
    if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(
        np.int32(error is not None)) and error is None:
      error = ValueError(f"Process 0 could not train the tokenizer {path} "
                         "(its log says why).")
    if error is not None:
      raise error
  return load(path, data.tokenizer_type, data.lower_case)
