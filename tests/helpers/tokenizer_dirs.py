"""Hugging Face tokenizer directories built here (tokenizer.json and
tokenizer_config.json), one per kind bert_jax runs with
``data.tokenizer_type="hf_json"``, trained on the demo corpus plus `TEXT`:

  byte_level_bpe  bert_jax's own trainer: RoBERTa's layout (<s> 0, <pad> 1,
                  </s> 2, <unk> 3, <mask> last)
  xlmr_unigram    a SentencePiece Unigram in XLM-R's layout (the same four
                  first, <mask> last), Metaspace "▁", XLM-R's templates
  wordpiece       BERT's WordPiece ([PAD] [UNK] [CLS] [SEP] [MASK] first)
  modernbert_bpe  a byte-level BPE with ModernBERT's special names ([CLS],
                  [SEP], [PAD], [MASK], [UNK] after the bytes' merges
                  start; <|endoftext|> and <|padding|> first)

`TEXT` is real text with accents, CJK, emoji, URLs and control characters
(no NUL, no line breaks, nothing to strip at either end, single spaces).
`roberta_dir` and `modernbert_dir` save transformers' own random-init
masked LMs beside a RoBERTa-layout and a ModernBERT-layout BPE.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors
from tokenizers import trainers

TEXT = (
    "Café naïve résumé — Zürich, São Paulo and Kraków.",
    "東京と大阪は日本の都市です。北京欢迎你！",
    "서울 and Москва; Αθήνα, مرحبا بالعالم, हिन्दी भाषा.",
    "Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷 and ✓ ★ ♥.",
    "See https://example.org/path?q=1&lang=en#frag or mail a.b@c.org today.",
    "Tabs\tand\tbells\x07 and escapes\x1b[31m red\x1b[0m end.",
    "Zero\u200bwidth, soft\u00adhyphen, nbsp\u00a0here, RTL \u202eevil\u202c.",
    "Numbers 3.14159, 1,000,000 and 42nd; CamelCase snake_case kebab-case.",
    "ﬁ ligatures, Ｆｕｌｌｗｉｄｔｈ, ½ and ² superscripts.",
    "The function returns None when the object is not found.",
)
KINDS = ("byte_level_bpe", "xlmr_unigram", "wordpiece")


def corpus() -> list[str]:
  """The demo corpus's lines and TEXT: what the tokenizers train on."""
  from bert_jax.data import demo_corpus
  lines = [s for _, doc in demo_corpus.demo_documents() for s in doc]
  return lines + list(TEXT) * 3


def _save(directory: str, tok: Tokenizer, config: dict) -> str:
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(dict(config, tokenizer_class="PreTrainedTokenizerFast",
                   clean_up_tokenization_spaces=False), f, indent=2)
  return os.path.join(directory, "tokenizer.json")


def byte_level_bpe(directory: str, vocab_size: int = 800) -> str:
  """bert_jax's byte-level BPE with RoBERTa's special tokens."""
  from bert_jax.data import tokenizers
  path = os.path.join(directory, "tokenizer.json")
  tokenizers.train(tokenizers.HF_JSON, iter(corpus()), vocab_size, False,
                   path)
  return path


def xlmr_unigram(directory: str, vocab_size: int = 800) -> str:
  """A SentencePiece Unigram tokenizer.json in XLM-R's layout."""
  tok = Tokenizer(models.Unigram())
  tok.normalizer = normalizers.Sequence(
      [normalizers.NFKC(), normalizers.Replace(" {2,}", " ")])
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                               prepend_scheme="always")
  tok.decoder = decoders.Metaspace(replacement="\u2581",
                                   prepend_scheme="always")
  tok.train_from_iterator(corpus(), trainers.UnigramTrainer(
      vocab_size=vocab_size - 1, show_progress=False, unk_token="<unk>",
      special_tokens=["<s>", "<pad>", "</s>", "<unk>"]))
  tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
      special_tokens=[("<s>", 0), ("</s>", 2)])
  return _save(directory, tok, dict(
      bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
      pad_token="<pad>", unk_token="<unk>", mask_token="<mask>"))


def wordpiece(directory: str, vocab_size: int = 800) -> str:
  """BERT's WordPiece as a tokenizer.json (uncased)."""
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(
      vocab_size=vocab_size, special_tokens=specials, show_progress=False))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  return _save(directory, tok, dict(
      cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
      unk_token="[UNK]", mask_token="[MASK]", do_lower_case=True))


def modernbert_bpe(directory: str, vocab_size: int = 800) -> str:
  """A byte-level BPE with ModernBERT's special tokens: <|endoftext|>,
  <|padding|> first, then [UNK] [CLS] [SEP] [PAD] [MASK] added after the
  pieces, as its tokenizer.json holds them."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(corpus(), trainers.BpeTrainer(
      vocab_size=vocab_size - 5, show_progress=False,
      special_tokens=["<|endoftext|>", "<|padding|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.add_special_tokens([AddedToken(t, special=True) for t in (
      "[UNK]", "[CLS]", "[SEP]", "[PAD]")] + [
          AddedToken("[MASK]", lstrip=True, special=True)])
  vocab = tok.get_vocab()
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
  return _save(directory, tok, dict(
      cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
      unk_token="[UNK]", mask_token="[MASK]"))


BUILDERS = {"byte_level_bpe": byte_level_bpe, "xlmr_unigram": xlmr_unigram,
            "wordpiece": wordpiece, "modernbert_bpe": modernbert_bpe}


# -----------------------------------------------------------------------------
# Tiny Hugging Face checkpoints with these tokenizers (transformers' own
# random init, saved by transformers).
# -----------------------------------------------------------------------------
def roberta_dir(directory: str, vocab_size: int | None = None,
                tokenizer_size: int = 800) -> str:
  """A RobertaForMaskedLM directory (2 x 64, positions for 64 tokens) with
  the byte-level BPE of RoBERTa's layout; `vocab_size`: its table's rows
  (default: the tokenizer's)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  byte_level_bpe(directory, tokenizer_size)
  torch.manual_seed(0)
  config = transformers.RobertaConfig(
      vocab_size=vocab_size or tokenizer_size, hidden_size=64,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
      max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
      bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
  transformers.RobertaForMaskedLM(config).save_pretrained(directory)
  return directory


def modernbert_dir(directory: str, tokenizer_size: int = 800) -> str:
  """A ModernBertForMaskedLM directory (3 x 64: global, sliding, sliding;
  a 16-token window) with a byte-level BPE of ModernBERT's special
  tokens."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  path = modernbert_bpe(directory, tokenizer_size)
  ids = Tokenizer.from_file(path).get_vocab()
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      vocab_size=tokenizer_size, hidden_size=64, num_hidden_layers=3,
      num_attention_heads=4, intermediate_size=96,
      max_position_embeddings=128, local_attention=16,
      layer_types=["full_attention", "sliding_attention",
                   "sliding_attention"],
      pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
      sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"],
      eos_token_id=ids["[SEP]"])
  transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
  return directory
