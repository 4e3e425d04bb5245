"""The interface every tokenizer of a run presents, and its special tokens.

A tokenizer (``tokenizers.py``: SentencePiece, WordPiece in graph;
``hf_json_tokenizer.py``: any Hugging Face ``tokenizer.json``) gives the
pipeline its special-token ids, the vocabulary size, a ``tokenize`` that
runs inside tf.data (strings -> ragged int32 ids), a per-id ``word_start``
table for whole-word masking, and host-side ``encode`` / ``decode`` /
``tokenize_with_offsets``.

Special tokens are found by role, read from the tokenizer: the names its
own files give (a ``tokenizer_config.json``'s ``mask_token``, ...), else the
conventional names of BERT (``[CLS] [SEP] [PAD] [MASK] [UNK]``) and of
RoBERTa / XLM-R / ModernBERT's BPE vocabularies (``<s> </s> <pad> <mask>
<unk>``), in that order.
"""

from __future__ import annotations

from typing import (TYPE_CHECKING, Iterable, Mapping, NamedTuple, Optional,
                    Sequence)

import numpy as np

if TYPE_CHECKING:
  import tensorflow as tf

# Role -> the names a vocabulary gives it, first match wins.
ROLES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"),
         "cls": ("[CLS]", "<s>", "<cls>"), "sep": ("[SEP]", "</s>", "<sep>"),
         "mask": ("[MASK]", "<mask>")}


class Pieces(NamedTuple):
  """One text's pieces: ids and [start, end) character offsets (int32)."""
  ids: np.ndarray
  starts: np.ndarray
  ends: np.ndarray


def char_pieces(text: str, ids, starts, ends, strip=False,
                byte_offsets=True):
  """Offsets -> character offsets (a Pieces): UTF-8 byte offsets unless
  `byte_offsets` is False; `strip` leaves a piece's leading whitespace
  (SentencePiece's "\u2581", byte-level BPE's "Ġ") out of its span."""
  b0, b1 = (np.asarray(b, np.int64).reshape(-1) for b in (starts, ends))
  if byte_offsets and not text.isascii():  # The char index of each byte.
    widths = [len(ch.encode("utf-8")) for ch in text] + [1]
    of_byte = np.repeat(np.arange(len(text) + 1), widths)
    b0, b1 = of_byte[b0], of_byte[b1]
  b0 = b0.copy()
  for k in range(len(b0) if strip else 0):
    while b0[k] < b1[k] and text[b0[k]].isspace():
      b0[k] += 1
  return Pieces(np.asarray(ids, np.int32).reshape(-1), b0.astype(np.int32),
                b1.astype(np.int32))


class Tokenizer:
  """Common interface over SentencePiece, WordPiece and tokenizer.json."""

  kind: str
  path: str
  vocab_size: int
  pieces: list[str]
  lower_case: bool
  # Whether `tokenize` is a TensorFlow op (else a host-side call from
  # inside the graph, which costs host CPU per token: tools/bench_input.py).
  in_graph: bool = True
  # Roles a run needs (a tokenizer that never emits an unknown token, such
  # as a byte-level BPE, may lack "unk").
  required_roles: tuple[str, ...] = ("pad", "unk", "cls", "sep", "mask")

  def _init_specials(self, named: Optional[Mapping[str, str]] = None,
                     extra: Iterable[int] = ()) -> None:
    """Special ids by role: `named` (role -> token its files name), else
    the ROLES names; `extra`: more ids that are special (control pieces,
    added special tokens)."""
    index = {}
    for i, p in enumerate(self.pieces):
      index.setdefault(p, i)
    named = named or {}
    for role, names in ROLES.items():
      found = index.get(named[role]) if named.get(role) else None
      if found is None:
        found = next((index[n] for n in names if n in index), None)
      setattr(self, f"{role}_id", found)
    self._extra_special = tuple(int(i) for i in extra)

  @property
  def missing_special_tokens(self) -> list[str]:
    """The required roles it lacks, each with the names looked for
    ("[MASK] / <mask>")."""
    return [" / ".join(ROLES[r]) for r in self.required_roles
            if getattr(self, f"{r}_id") is None]

  @property
  def special_ids(self) -> list[int]:
    """Ids never selected for masking nor drawn as random replacements."""
    ids = [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]
    ids += list(getattr(self, "_extra_special", ()))
    ids += [i for i, p in enumerate(self.pieces)
            if p.startswith("[unused") or p in ("<s>", "</s>")]
    return sorted({i for i in ids if i is not None})

  @property
  def word_start(self) -> np.ndarray:
    """bool [vocab_size]: True where a piece begins a word."""
    raise NotImplementedError

  def tokenize(self, lines: tf.Tensor) -> tf.RaggedTensor:
    """In graph: string [N] -> int32 ragged [N, None]."""
    raise NotImplementedError

  def encode(self, text: str) -> list[int]:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return self.tokenize(tf.constant([text]))[0].numpy().tolist()

  def id_to_piece(self, i: int) -> str:
    return self.pieces[i]

  def tokenize_with_offsets(self, texts: Sequence[str]) -> list[Pieces]:
    """Host side: per text, its ids and each piece's CHARACTER span in the
    original text (leading whitespace excluded; the same ids as
    ``tokenize``). What token tagging and extractive QA map predictions
    back to the text with."""
    raise NotImplementedError

  def decode(self, ids: Iterable[int]) -> str:
    raise NotImplementedError

  def __repr__(self):
    return (f"{type(self).__name__}(path={self.path!r}, vocab_size="
            f"{self.vocab_size}, cls={self.cls_id}, sep={self.sep_id}, "
            f"mask={self.mask_id}, pad={self.pad_id})")

