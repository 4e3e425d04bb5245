"""Any Hugging Face ``tokenizer.json`` as a run's tokenizer
(``data.tokenizer_type="hf_json"``): byte-level BPE (RoBERTa, ModernBERT),
SentencePiece Unigram or BPE (XLM-R), WordPiece.

It runs with the ``tokenizers`` library, the code transformers' fast
tokenizers run, so its ids are Hugging Face's by construction. TensorFlow
has no op for these models: ``tokenize`` calls the library host-side from
inside the tf.data graph, one batched call per block of lines (a stateless
``tf.numpy_function``: a saved iterator resumes exactly; the library
encodes a batch on its own threads, outside the GIL): host CPU per token
on every epoch, where an in-graph tokenizer costs the tf.data threads.

Special tokens are read from the tokenizer: the roles a
``tokenizer_config.json`` beside the file names (``mask_token``, ...), else
the names of ``tokenizer_base.ROLES``; every token the file marks special is
never masked. Whole-word masking reads word starts from the kind: a leading
``Ġ`` (byte-level BPE) or the Metaspace replacement ``▁`` (SentencePiece)
starts a word, WordPiece's continuing prefix (``##``) continues one.

:func:`train_byte_level_bpe` trains one here (no ``data.tokenizer_path``):
RoBERTa's layout, ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>``
last, with a ``tokenizer_config.json`` that transformers reads.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np
import tokenizers as hf_tokenizers
from tokenizers import AddedToken
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import processors
from tokenizers import trainers

from bert_jax.data.tokenizer_base import Pieces
from bert_jax.data.tokenizer_base import Tokenizer
from bert_jax.data.tokenizer_base import char_pieces

if TYPE_CHECKING:
  import tensorflow as tf

HF_JSON = "hf_json"
CONFIG_FILE = "tokenizer_config.json"
# RoBERTa's special tokens in id order; <mask> comes after the pieces.
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
ROBERTA_MASK = "<mask>"


def _types(node) -> list[dict]:
  """The components of a tokenizer.json part (Sequences opened)."""
  if not isinstance(node, dict):
    return []
  inner = (node.get("pretokenizers") or node.get("decoders")
           or node.get("normalizers") or [])
  return [node] + [t for n in inner for t in _types(n)]


def word_rule(spec: dict) -> tuple[str, str]:
  """How a tokenizer.json's pieces mark words: ("starts", marker) when a
  piece that begins a word starts with the marker, ("continues", prefix)
  when a piece inside a word does, ("every", "") when it marks neither
  (every piece is its own word)."""
  model = spec.get("model") or {}
  prefix = model.get("continuing_subword_prefix")
  if model.get("type") == "WordPiece" or prefix:
    return "continues", prefix or "##"
  parts = _types(spec.get("pre_tokenizer")) + _types(spec.get("decoder"))
  kinds = {p.get("type"): p for p in parts}
  if "ByteLevel" in kinds:
    return "starts", "\u0120"  # "Ġ": the byte of a space before the word.
  if "Metaspace" in kinds:
    return "starts", kinds["Metaspace"].get("replacement", "\u2581")
  return "every", ""


def named_roles(cfg: dict) -> dict[str, str]:
  """role -> token named by a tokenizer_config.json dict: transformers'
  names for them (cls_token, ...; bos / eos where those are absent)."""
  out = {}
  for role, keys in (("pad", ("pad_token",)), ("unk", ("unk_token",)),
                     ("cls", ("cls_token", "bos_token")),
                     ("sep", ("sep_token", "eos_token")),
                     ("mask", ("mask_token",))):
    for key in keys:
      value = cfg.get(key)
      value = value.get("content") if isinstance(value, dict) else value
      if value:
        out[role] = value
        break
  return out


class HFJsonTokenizer(Tokenizer):
  """A tokenizer.json run host-side (see the module docstring)."""

  kind = HF_JSON
  in_graph = False
  # A byte-level BPE never emits an unknown token and may have none.
  required_roles = ("pad", "cls", "sep", "mask")

  def __init__(self, path: str, spec: dict, config: dict | None = None):
    """`spec`: the tokenizer.json at `path`, parsed; `config`: the
    tokenizer_config.json beside it, if any."""
    self.path = path
    self._tok = hf_tokenizers.Tokenizer.from_str(json.dumps(spec))
    self._tok.no_padding()
    self._tok.no_truncation()
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self.vocab_size = max(vocab.values()) + 1 if vocab else 0
    self.pieces = [""] * self.vocab_size
    for piece, i in vocab.items():
      self.pieces[i] = piece
    self.lower_case = False  # Any normalization is the file's own.
    self._init_specials(named_roles(config or {}), [
        t["id"] for t in spec.get("added_tokens", []) if t.get("special")])
    self.rule = word_rule(spec)

  @property
  def word_start(self) -> np.ndarray:
    how, marker = self.rule
    if how == "starts":
      ws = np.array([p.startswith(marker) for p in self.pieces])
    elif how == "continues":
      ws = np.array([not p.startswith(marker) for p in self.pieces])
    else:
      ws = np.ones([self.vocab_size], bool)
    ws[self.special_ids] = True
    return ws

  def _encode_numpy(self, lines: np.ndarray):
    """Host side: byte strings [N] -> (flat int32 ids, int64 row lengths)."""
    texts = [x.decode("utf-8", errors="replace") for x in lines.reshape(-1)]
    encodings = self._tok.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), np.int64,
                          count=len(texts))
    flat = np.fromiter(itertools.chain.from_iterable(
        e.ids for e in encodings), np.int32, count=int(lengths.sum()))
    return flat, lengths

  def tokenize(self, lines: tf.Tensor) -> tf.RaggedTensor:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # Stateless: the same lines give the same ids, so tf.data may save an
    # iterator that runs it (a stateful op would be refused).
    flat, lengths = tf.numpy_function(self._encode_numpy, [lines],
                                      [tf.int32, tf.int64], stateful=False)
    flat.set_shape([None])
    lengths.set_shape([None])
    return tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch_fast(
        list(texts), add_special_tokens=False)]

  def tokenize_with_offsets(self, texts: Sequence[str]) -> list[Pieces]:
    out = []
    for text, e in zip(texts, self._tok.encode_batch(
        list(texts), add_special_tokens=False)):
      starts = [a for a, _ in e.offsets]
      ends = [b for _, b in e.offsets]
      out.append(char_pieces(text, e.ids, starts, ends, strip=True,
                             byte_offsets=False))
    return out

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids if int(i) != self.pad_id]
    return self._tok.decode(ids, skip_special_tokens=False)


def load(path: str, text: str, config_text: str | None = None
         ) -> HFJsonTokenizer:
  """The tokenizer.json at `path`, given its `text` (and that of the
  tokenizer_config.json beside it); ValueError naming it when it is not one
  the `tokenizers` library reads."""
  try:
    config = json.loads(config_text) if config_text else None
    return HFJsonTokenizer(path, json.loads(text), config)
  except Exception as e:  # pylint: disable=broad-except
    # The library's parse errors are plain Exceptions.
    raise ValueError(
        f"data.tokenizer_path={path!r} is not a tokenizer.json the "
        f"tokenizers library reads ({str(e).splitlines()[0][:200]}).") from None


def train_byte_level_bpe(sentences: Iterator[str], vocab_size: int
                         ) -> tuple[str, dict]:
  """A byte-level BPE with RoBERTa's special tokens trained on `sentences`:
  (tokenizer.json text, tokenizer_config.json dict)."""
  tok = hf_tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=max(int(vocab_size) - 1, len(ROBERTA_SPECIALS) + 256),
      special_tokens=list(ROBERTA_SPECIALS), show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(sentences, trainer=trainer)
  # RoBERTa's <mask> takes the space before it ("a <mask>" masks " b").
  tok.add_special_tokens([AddedToken(ROBERTA_MASK, lstrip=True,
                                     special=True)])
  vocab = tok.get_vocab()
  tok.post_processor = processors.RobertaProcessing(
      ("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]), trim_offsets=True,
      add_prefix_space=False)
  names = dict(zip(("bos_token", "pad_token", "eos_token", "unk_token"),
                   ROBERTA_SPECIALS))
  config = dict(names, cls_token="<s>", sep_token="</s>",
                mask_token=ROBERTA_MASK, add_prefix_space=False,
                tokenizer_class="PreTrainedTokenizerFast",
                clean_up_tokenization_spaces=False)
  return tok.to_str(), config

