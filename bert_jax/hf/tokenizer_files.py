"""Tokenizer files for Hugging Face: our tokenizers as `tokenizers` objects.

Builds a ``tokenizers.Tokenizer`` that gives the same ids as the in-graph
tf_text tokenizer (WordPiece vocab.txt or SentencePiece .model), writes
tokenizer.json + tokenizer_config.json so that ``AutoTokenizer`` loads it with
no custom code, and reads the tokenizer of an HF directory. A run whose
tokenizer is a tokenizer.json ("hf_json") exports that file as it is, with
its tokenizer_config.json (or one naming its special tokens). No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
from typing import Any

from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from tokenizers import AddedToken
from tokenizers import Regex
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors

from bert_jax.data import hf_json_tokenizer
from bert_jax.data import tokenizers as tokenizers_lib

# tokenizer_config.json names of our special tokens: "[CLS]" -> "cls_token".
SPECIAL_TOKENS = {t.strip("[]").lower() + "_token": t
                  for t in tokenizers_lib.SPECIAL_TOKENS}


@dataclasses.dataclass
class TokenizerSpec:
  """Where a training run's tokenizer lives and how it was used."""
  kind: str  # "sentencepiece", "wordpiece" or "hf_json"
  path: str  # the .model file, vocab.txt or tokenizer.json
  lower_case: bool = True


def _hf_json_names(spec: TokenizerSpec) -> dict[str, str]:
  """tokenizer_config.json names of a tokenizer.json's special tokens, by
  the roles bert_jax reads from it ({"cls_token": "<s>", ...})."""
  with open(spec.path, encoding="utf-8") as f:
    text = f.read()
  beside = os.path.join(os.path.dirname(spec.path),
                        hf_json_tokenizer.CONFIG_FILE)
  config = None
  if os.path.isfile(beside):
    with open(beside, encoding="utf-8") as f:
      config = f.read()
  tok = hf_json_tokenizer.load(spec.path, text, config)
  return {f"{role}_token": tok.pieces[getattr(tok, f"{role}_id")]
          for role in ("cls", "sep", "pad", "mask", "unk")
          if getattr(tok, f"{role}_id") is not None}


def special_token_names(spec: TokenizerSpec) -> dict[str, str]:
  """{"pad_token": name, ...}: the names of the spec's special tokens as a
  tokenizer_config.json gives them (BERT's for our own kinds)."""
  if spec.kind == hf_json_tokenizer.HF_JSON:
    return _hf_json_names(spec)
  return dict(SPECIAL_TOKENS)


def _special_added_tokens(tokens):
  return [AddedToken(t, special=True, normalized=False) for t in tokens]


@functools.lru_cache(maxsize=1)
def _case_folds() -> dict[str, str]:
  """Characters that lower-casing leaves but full case folding changes."""
  folds = {}
  for cp in range(0x110000):
    c = chr(cp)
    if c.lower() == c and c.casefold() != c and not 0xD800 <= cp < 0xE000:
      folds[c] = c.casefold()
  return folds


def _wordpiece_tokenizer(vocab_path: str, lower_case: bool):
  with open(vocab_path, encoding="utf-8") as f:
    vocab = {}
    for line in f:
      tok = line.rstrip("\n")
      if tok and tok not in vocab:
        vocab[tok] = len(vocab)
  for t in SPECIAL_TOKENS.values():
    if t not in vocab:
      raise ValueError(f"{vocab_path} lacks the special token {t}.")
  tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]",
                                   max_input_chars_per_word=100))
  bert = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=lower_case,
      lowercase=lower_case)
  # tf_text.FastBertTokenizer treats NUL as a separator; BERT's cleaner drops it.
  norms = [normalizers.Replace("\x00", " ")]
  if lower_case:
    # FastBertTokenizer(lower_case_nfd_strip_accents=True) applies ICU
    # NFKC case folding before stripping accents: compatibility forms
    # ("\ufb01" -> "fi", full-width digits), case folding ("\u00df" -> "ss",
    # final sigma -> sigma), and it drops default-ignorable Hangul fillers.
    norms += [normalizers.NFKD(), normalizers.Replace("\u0345", "\u03b9"),
              normalizers.Replace("\u115f", ""),
              normalizers.Replace("\u1160", ""), bert]
    norms += [normalizers.Replace(k, v) for k, v in _case_folds().items()]
  else:
    norms.append(bert)
  tok.normalizer = normalizers.Sequence(norms)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
  return tok, vocab


def _sentencepiece_tokenizer(model_path: str, lower_case: bool):
  """A `tokenizers` Unigram/BPE tokenizer equal to SentencePiece on plain text."""
  proto = sp_pb2.ModelProto()
  with open(model_path, "rb") as f:
    data = f.read()
  try:
    proto.ParseFromString(data)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{model_path} is not a readable SentencePiece model "
                     "(truncated, damaged or another kind of file).") from e
  if not proto.pieces:
    raise ValueError(f"{model_path} is not a readable SentencePiece model "
                     "(no pieces).")
  # Piece types: 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte.
  vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  byte_fallback = proto.trainer_spec.byte_fallback
  model_type = proto.trainer_spec.model_type  # 1 unigram, 2 bpe
  # Control pieces never come out of SentencePiece for text: keep them out of
  # the Unigram search (they are matched as added special tokens instead).
  scores = [(p.piece, p.score if p.type in (1, 4, 6) else
             (-1e9 if p.type == 3 else p.score)) for p in proto.pieces]
  unk_id = proto.trainer_spec.unk_id
  if model_type == 1:
    tok = Tokenizer(models.Unigram(scores, unk_id=unk_id,
                                   byte_fallback=byte_fallback))
  elif model_type == 2:
    normal = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces)
              if p.type == 1}
    ranked = sorted((-normal[a + b][0], normal[a + b][1], a, b)
                    for tokn in normal for a, b in
                    ((tokn[:k], tokn[k:]) for k in range(1, len(tokn)))
                    if a in normal and b in normal)
    tok = Tokenizer(models.BPE(vocab, [(a, b) for _, _, a, b in ranked],
                               unk_token=proto.pieces[unk_id].piece,
                               fuse_unk=True, byte_fallback=byte_fallback))
  else:
    raise ValueError(f"{model_path}: SentencePiece model_type {model_type} "
                     "is not supported (unigram or bpe only).")
  spec = proto.normalizer_spec
  # Lower-casing, if any, is part of the model's own normalizer
  # (nmt_nfkc_cf), which the precompiled charsmap carries: `lower_case` is
  # not applied on top.
  del lower_case
  norms = []
  if spec.precompiled_charsmap:
    norms.append(normalizers.Precompiled(spec.precompiled_charsmap))
  # The dummy prefix is added by Metaspace(prepend_scheme="first"): only at
  # the start of the text, not after a special token such as [MASK] (so
  # "about [MASK]." gives "_about [MASK] ." as the model saw in training).
  # "first" looks at the original offset, so leading spaces are collapsed to
  # one (which becomes the prefix) rather than deleted; Metaspace adds none
  # when the text already starts with "_", hence the doubling of a literal one.
  if spec.remove_extra_whitespaces:
    norms += [normalizers.Replace(Regex("\\A\u2581"), "\u2581\u2581"),
              normalizers.Replace(Regex(" +\\z"), ""),
              normalizers.Replace(Regex(" {2,}"), " ")]
  if spec.escape_whitespaces:
    norms.append(normalizers.Replace(" ", "\u2581"))
  if not spec.remove_extra_whitespaces and spec.add_dummy_prefix:
    norms.append(normalizers.Replace(Regex("\\A\u2581"), "\u2581\u2581"))
  tok.normalizer = normalizers.Sequence(norms)
  pre = []
  if spec.add_dummy_prefix:
    pre.append(pre_tokenizers.Metaspace(replacement="▁",
                                        prepend_scheme="first", split=False))
  user = [p.piece for p in proto.pieces if p.type == 4]
  if user:
    pattern = "|".join(re.escape(u) for u in sorted(user, key=len,
                                                    reverse=True))
    pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
  if pre:
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
  decs = [decoders.Replace("▁", " ")]
  if byte_fallback:
    decs.append(decoders.ByteFallback())
  decs.append(decoders.Fuse())
  if spec.add_dummy_prefix:
    decs.append(decoders.Strip(content=" ", left=1))
  tok.decoder = decoders.Sequence(decs)
  return tok, vocab


def build_hf_tokenizer(spec: TokenizerSpec):
  """A `tokenizers.Tokenizer` matching the training tokenizer, with BERT's
  [CLS] A [SEP] (B [SEP]) template and the special tokens registered."""
  if spec.kind == hf_json_tokenizer.HF_JSON:  # Its own template and specials.
    return Tokenizer.from_file(spec.path)
  if spec.kind == "wordpiece":
    tok, vocab = _wordpiece_tokenizer(spec.path, spec.lower_case)
  elif spec.kind == "sentencepiece":
    tok, vocab = _sentencepiece_tokenizer(spec.path, spec.lower_case)
  else:
    raise ValueError(f"data.tokenizer_type={spec.kind!r}: expected "
                     "'sentencepiece', 'wordpiece' or 'hf_json'.")
  specials = [t for t in SPECIAL_TOKENS.values() if t in vocab]
  for t in ("[CLS]", "[SEP]", "[MASK]"):
    if t not in vocab:
      raise ValueError(f"Tokenizer {spec.path} has no {t} piece.")
  tok.add_special_tokens(_special_added_tokens(specials))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
  return tok


def write_hf_tokenizer_files(out_dir: str, spec: TokenizerSpec, *,
                             model_max_length: int = 512,
                             tokenizer=None) -> dict:
  """tokenizer.json + tokenizer_config.json (+ vocab.txt or the .model).

  Returns the tokenizer_config dict. AutoTokenizer.from_pretrained(out_dir)
  loads the result with no custom code. `tokenizer`: the spec's
  :func:`build_hf_tokenizer`, when the caller already built it.
  """
  tok = tokenizer if tokenizer is not None else build_hf_tokenizer(spec)
  os.makedirs(out_dir, exist_ok=True)
  if spec.kind == hf_json_tokenizer.HF_JSON:
    return _write_hf_json(out_dir, spec, model_max_length)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  vocab = tok.get_vocab()
  specials = {k: v for k, v in SPECIAL_TOKENS.items() if v in vocab}
  if "[UNK]" not in vocab and spec.kind == "sentencepiece":
    proto = sp_pb2.ModelProto()
    with open(spec.path, "rb") as f:
      proto.ParseFromString(f.read())
    specials["unk_token"] = proto.pieces[proto.trainer_spec.unk_id].piece
  cfg = dict(specials, model_max_length=int(model_max_length),
             clean_up_tokenization_spaces=False,
             model_input_names=["input_ids", "token_type_ids",
                                "attention_mask"])
  if spec.kind == "wordpiece":
    shutil.copyfile(spec.path, os.path.join(out_dir, "vocab.txt"))
    # Not "BertTokenizer": transformers would rebuild its own normalizer
    # from vocab.txt and lose the tf_text-exact one in tokenizer.json.
    cfg.update(tokenizer_class="PreTrainedTokenizerFast",
               do_lower_case=spec.lower_case, strip_accents=None,
               tokenize_chinese_chars=True)
  else:
    shutil.copyfile(spec.path, os.path.join(out_dir, "spiece.model"))
    cfg.update(tokenizer_class="PreTrainedTokenizerFast",
               do_lower_case=spec.lower_case)
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
    json.dump(specials, f, indent=2)
  return cfg


def _write_hf_json(out_dir: str, spec: TokenizerSpec,
                   model_max_length: int) -> dict:
  """A tokenizer.json run's files: the file itself, its
  tokenizer_config.json (or one naming its special tokens) with the
  model's length, the special tokens map."""
  names = special_token_names(spec)
  shutil.copyfile(spec.path, os.path.join(out_dir, "tokenizer.json"))
  beside = os.path.join(os.path.dirname(spec.path),
                        hf_json_tokenizer.CONFIG_FILE)
  cfg = dict(names, tokenizer_class="PreTrainedTokenizerFast",
             clean_up_tokenization_spaces=False)
  if os.path.isfile(beside):
    with open(beside, encoding="utf-8") as f:
      cfg = json.load(f)
    cfg.pop("auto_map", None)  # Custom code bert_jax does not ship.
  cfg["model_max_length"] = int(model_max_length)
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
    json.dump(names, f, indent=2)
  return cfg


def _types(node) -> list[str]:
  """The component types in a tokenizer.json part (Sequences opened)."""
  if isinstance(node, dict):
    inner = node.get("pretokenizers") or node.get("decoders") or []
    return [node.get("type", "")] + [t for n in inner for t in _types(n)]
  return []


def tokenizer_json_kind(path: str) -> str:
  """In words, the kind of tokenizer a Hugging Face tokenizer.json holds
  ("byte-level BPE", "SentencePiece Unigram", "WordPiece", ...): what a
  message names when bert_jax cannot run it."""
  try:
    with open(path, encoding="utf-8") as f:
      spec = json.load(f)
    model = spec["model"]
  except (OSError, ValueError, KeyError, TypeError):
    return "file bert_jax cannot read as a tokenizer.json"
  kind = model.get("type") or ("BPE" if "merges" in model else "?")
  parts = _types(spec.get("pre_tokenizer")) + _types(spec.get("decoder"))
  if kind == "BPE":
    return ("byte-level BPE" if "ByteLevel" in parts else
            "SentencePiece BPE" if "Metaspace" in parts else "BPE")
  if kind == "Unigram":
    return "SentencePiece Unigram"
  return kind if kind != "?" else "tokenizer of an unknown kind"


@dataclasses.dataclass
class LoadedTokenizer:
  """A `tokenizers.Tokenizer` plus what fill-mask needs from the HF config."""
  tokenizer: Any
  mask_token: str = "[MASK]"
  pad_token: str = "[PAD]"
  clean_up_tokenization_spaces: bool = False

  @property
  def mask_token_id(self) -> int:
    return self.tokenizer.token_to_id(self.mask_token)

  @property
  def pad_token_id(self):
    return self.tokenizer.token_to_id(self.pad_token)


def load_hf_tokenizer(path: str) -> LoadedTokenizer:
  """Tokenizer of an HF directory: tokenizer.json, else vocab.txt (BERT)."""
  cfg = {}
  cfg_path = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(cfg_path):
    with open(cfg_path) as f:
      cfg = json.load(f)

  def token_str(v, default):
    if isinstance(v, dict):
      return v.get("content", default)
    return v or default

  mask = token_str(cfg.get("mask_token"), "[MASK]")
  pad = token_str(cfg.get("pad_token"), "[PAD]")
  cleanup = bool(cfg.get("clean_up_tokenization_spaces", False))
  tj = os.path.join(path, "tokenizer.json")
  if os.path.isfile(tj):
    tok = Tokenizer.from_file(tj)
  elif os.path.isfile(os.path.join(path, "vocab.txt")):
    tok = build_hf_tokenizer(TokenizerSpec(
        "wordpiece", os.path.join(path, "vocab.txt"),
        bool(cfg.get("do_lower_case", True))))
  else:
    raise FileNotFoundError(f"No tokenizer.json or vocab.txt in {path}.")
  return LoadedTokenizer(tok, mask, pad, cleanup)
