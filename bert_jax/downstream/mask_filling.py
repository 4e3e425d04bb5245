"""Fill in [MASK] tokens with a pretrained model: the zero-shot check of BERT.

  python -m bert_jax.fill_mask --model WORKDIR_OR_HF_DIR [--top_k 5] [--json] \
      "Elephants are playing in the zoo with monkeys. The story is about [MASK]."

--model is a training workdir (latest checkpoint, or --step; an ELECTRA
run fills with its generator), an ELECTRA export (discriminator/ +
generator/), a Hugging Face BERT, ALBERT, DistilBERT or ModernBERT
directory (ours from tools/convert_to_hf.py, or anyone's), a Google TF
checkpoint directory, or a tools/convert_from_hf.py output. The model runs in
JAX (float32); tokenization uses the `tokenizers` library with the same
tokenizer.json an export writes, so no TensorFlow and no torch are imported.
The result has the shape of transformers' pipeline("fill-mask") output:
a list of {score, token, token_str, sequence} per mask (a list of such lists
when the text has several masks).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Sequence

import jax
import numpy as np
from flax import nnx

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.downstream import packed_texts
from bert_jax.families import bert as bert_family
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files

# transformers' clean_up_tokenization, for HF directories that ask for it.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
            (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
            (" 're", "'re"))


def load(path: str, step: int | None = None):
  """-> (params, model config, LoadedTokenizer, table) for any --model:
  its run's masked LM (``compose.masked_lm``; ELECTRA's generator).

  ValueError when it has none: a fine-tuned classifier, or a Hugging Face
  directory without an MLM head (a BertModel such as sentence-transformers'
  MiniLM), whose head would be a fresh random init.
  """
  source = pretrained.resolve(path, step)
  params, report = pretrained.load_params(source)
  if MLM_HEAD in report.fresh:
    raise ValueError(no_masked_lm_head(f"--model={path}"))
  try:
    model = compose.masked_lm(source.config, params)
  except ValueError as e:  # A fine-tuned classifier: name what it came from.
    start = (source.config.get("train") or {}).get("init_from", "")
    raise ValueError(f"--model={path}: {e}" + (
        f" Fill masks with the model it was fine-tuned from: {start}."
        if start else "")) from None
  return (model.params, model.model_config, pretrained.load_tokenizer(source),
          model.table)


MLM_HEAD = "mlm_head"  # Our prefix of the masked-LM head (every family).


def no_masked_lm_head(what: str) -> str:
  """The refusal of fill_mask and zero_shot for a model (`what`: how the
  user named it) whose masked-LM head the source lacks (it would be a
  random init)."""
  return (f"{what} has no masked-LM head (a BertModel checkpoint, "
          "e.g. sentence-transformers'): filling masks needs one trained "
          "with MLM (a pretraining workdir or a BertForMaskedLM / "
          "BertForPreTraining directory).")


class TextError(ValueError):
  """A text that cannot be filled (no mask, masks too far apart), with its
  position among the texts."""

  def __init__(self, index: int, reason: str):
    super().__init__(f"text {index + 1}: {reason}")
    self.index, self.reason = index, reason


class FillMask:
  """A jitted float32 forward pass plus the pipeline's post-processing."""

  def __init__(self, params, model_config,
               tokenizer: tokenizer_files.LoadedTokenizer,
               table: mapping.Table = bert_family.BERT):
    model = mapping.make_model(params, model_config, table, dtype="float32")
    graphdef, state = nnx.split(model)
    self._state = state

    # The embedding table may be padded past the tokenizer's pieces (a
    # vocab_size rounded up, or a small corpus's SentencePiece model): those
    # rows are no token. They are left out of the softmax, as an export
    # leaves them out of the model (hf.vocab), so a workdir and its export
    # give the same scores here and in Hugging Face's fill-mask pipeline.
    self.vocab_size = min(int(model_config.vocab_size),
                          int(tokenizer.tokenizer.get_vocab_size()))
    self.max_positions = int(model_config.max_position_embeddings)
    n = self.vocab_size

    @jax.jit
    def logits_fn(state, ids, mask, seg):
      model = nnx.merge(graphdef, state)
      out = model(ids, mask, seg, deterministic=True)
      logits = out["mlm_logits"].astype(jax.numpy.float32)[..., :n]
      return jax.nn.softmax(logits, axis=-1)

    @functools.partial(jax.jit, static_argnames="k")
    def top_k_fn(state, batch, positions, k):
      """Packed rows: the k most probable tokens at `positions` [B, P]
      (lax.top_k: descending, ties by lower id, as the host sort below)."""
      model = nnx.merge(graphdef, state)
      out = model(batch["input_ids"], batch["input_mask"],
                  batch["segment_ids"], positions, deterministic=True,
                  sequence_ids=batch["sequence_ids"],
                  position_ids=batch["position_ids"])
      logits = out["mlm_logits"].astype(jax.numpy.float32)[..., :n]
      return jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)

    self._probs, self._top_k = logits_fn, top_k_fn
    self.tokenizer = tokenizer

  def _decode(self, ids, skip_special_tokens: bool) -> str:
    text = self.tokenizer.tokenizer.decode(
        [int(i) for i in ids], skip_special_tokens=skip_special_tokens)
    if self.tokenizer.clean_up_tokenization_spaces:
      for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text

  def _window(self, ids, seg, mask_id):
    """The model's max_position_embeddings tokens around the masks.

    Keeps the first and last token ([CLS], [SEP]) and the text tokens
    centred on the [MASK] span, with a warning (transformers' pipeline
    raises instead); a span wider than the model's positions is an error.
    """
    n, room = ids.shape[1], self.max_positions - 2
    body = np.flatnonzero(ids[0, 1:-1] == mask_id)
    first, last = int(body[0]), int(body[-1])
    if last - first + 1 > room:
      raise ValueError(
          f"The {self.tokenizer.mask_token} tokens are {last - first + 1} "
          f"tokens apart, more than the model's {self.max_positions} "
          "positions (max_position_embeddings) hold: shorten the text.")
    start = first - (room - (last - first + 1)) // 2
    start = max(0, min(start, n - 2 - room))
    keep = np.r_[0, np.arange(1 + start, 1 + start + room), n - 1]
    logging.getLogger(__name__).warning(
        "The text is %d tokens, more than the model's %d positions "
        "(max_position_embeddings): predicting from tokens %d-%d, around "
        "the %s.", n, self.max_positions, start + 1, start + room,
        self.tokenizer.mask_token)
    return ids[:, keep], seg[:, keep]

  def _prepare(self, text: str):
    """(ids [1, n], token types [1, n], [MASK] positions) of `text`,
    windowed around its masks when longer than the model."""
    tok = self.tokenizer
    enc = tok.tokenizer.encode(text)
    ids = np.asarray([enc.ids], np.int32)
    seg = np.asarray([enc.type_ids], np.int32)
    mask_id = tok.mask_token_id
    if not np.any(ids[0] == mask_id):
      raise ValueError(
          f"The text has no {tok.mask_token} token: put {tok.mask_token} "
          f"where the word to predict goes, e.g. \"Paris is the "
          f"{tok.mask_token} of France.\"")
    if ids.shape[1] > self.max_positions:
      ids, seg = self._window(ids, seg, mask_id)
    return ids, seg, np.flatnonzero(ids[0] == mask_id)

  def _result(self, ids, positions, tokens, scores) -> list:
    """The pipeline's output from each mask's top tokens [M, k] and their
    scores."""
    tok = self.tokenizer
    single = len(positions) == 1
    result = []
    for pos, top, score in zip(positions, tokens, scores):
      row = []
      for t, p in zip(top, score):
        filled = ids[0].copy()
        filled[pos] = t
        if tok.pad_token_id is not None:
          filled = filled[filled != tok.pad_token_id]
        row.append({"score": float(p), "token": int(t),
                    "token_str": self._decode([t], False),
                    "sequence": self._decode(filled, single)})
      result.append(row)
    return result[0] if single else result

  def __call__(self, text: str, top_k: int = 5) -> list:
    """The masks of one text, on a row of its own length."""
    ids, seg, positions = self._prepare(text)
    probs = np.asarray(self._probs(self._state, ids, np.ones_like(ids), seg))
    top_k = min(top_k, self.vocab_size)
    # Descending probability; ties by lower id (torch.topk's order).
    tokens = [np.lexsort((np.arange(probs.shape[-1]), -probs[0, pos]))[:top_k]
              for pos in positions]
    scores = [probs[0, pos, t] for pos, t in zip(positions, tokens)]
    return self._result(ids, positions, tokens, scores)

  def fill_many(self, texts: Sequence[str], top_k: int = 5, *,
                seq_length: int = packed_texts.DEFAULT_SEQ_LENGTH,
                max_sequences: int = packed_texts.DEFAULT_MAX_SEQUENCES,
                batch_size: int = 8) -> list:
    """[self(text, top_k) for text in texts], computed on packed rows
    (``packed_texts``: several texts a row, each attending to itself);
    a text without a mask is a ValueError naming its position."""
    prepared = []
    for i, text in enumerate(texts):
      try:
        prepared.append(self._prepare(text))
      except ValueError as e:
        raise TextError(i, str(e)) from None
    k = min(top_k, self.vocab_size)
    top: list = [None] * len(texts)
    for b in packed_texts.batches(
        [p[0][0] for p in prepared], [p[1][0] for p in prepared],
        seq_length=seq_length, max_sequences=max_sequences,
        batch_size=batch_size, max_positions=self.max_positions,
        pad_id=self.tokenizer.pad_token_id or 0):
      # Each row's [MASK] positions, P a row (static: a power of two, at
      # least S, so that one compile serves one mask a text).
      where = [[(int(i), int(b["cls_positions"][r, s]))
                for s, i in enumerate(b[packed_texts.INDEX][r]) if i >= 0]
               for r in range(len(b["input_ids"]))]
      counts = [sum(len(prepared[i][2]) for i, _ in row) for row in where]
      p = max(b["cls_positions"].shape[1], 1)
      while p < max(counts):
        p *= 2
      positions = np.zeros((len(where), p), np.int32)
      for r, row in enumerate(where):
        at = [start + q for i, start in row for q in prepared[i][2]]
        positions[r, :len(at)] = at
      names = ("input_ids", "input_mask", "segment_ids", "sequence_ids",
               "position_ids")
      scores, tokens = jax.device_get(self._top_k(
          self._state, {n: b[n] for n in names}, positions, k=k))
      for r, row in enumerate(where):
        used = 0
        for i, _ in row:
          m = len(prepared[i][2])
          top[i] = (tokens[r, used:used + m], scores[r, used:used + m])
          used += m
    return [self._result(ids, positions, *top[i])
            for i, (ids, _, positions) in enumerate(prepared)]


# Lines filled together: memory is bounded by one chunk's inputs and
# outputs, whatever the file's size.
CHUNK_LINES = 4096


def write_file(runner: FillMask, input_path: str, output: str,
               top_k: int = 5, **packing) -> int:
  """`runner.fill_many` over every line of `input_path`, streamed in chunks
  of CHUNK_LINES lines to `output` as JSON lines (line i's result, shaped
  as the pipeline's, on line i). Written beside `output` and renamed when
  complete: a failure (a line without a mask, named by its number) leaves
  no file. `packing`: fill_many's seq_length, max_sequences, batch_size.
  Returns the lines filled."""
  if not os.path.isfile(input_path):
    raise FileNotFoundError(f"--input {input_path} does not exist.")
  partial = f"{output}.tmp{os.getpid()}"
  n = 0
  try:
    with open(input_path, encoding="utf-8") as f, open(partial, "w") as out:
      for chunk in _chunks(f):
        try:
          results = runner.fill_many(chunk, top_k, **packing)
        except TextError as e:
          raise ValueError(f"--input {input_path} line {n + e.index + 1}: "
                           f"{e.reason}") from None
        for r in results:
          out.write(json.dumps(r, ensure_ascii=False) + "\n")
        n += len(chunk)
    if not n:
      raise ValueError(f"--input {input_path} is empty: give one text with "
                       "[MASK] per line.")
    os.replace(partial, output)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return n


def _chunks(f):
  chunk = []
  for line in f:
    chunk.append(line.rstrip("\n"))
    if len(chunk) == CHUNK_LINES:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def fill_mask(model_path: str, text: str, top_k: int = 5,
              step: int | None = None) -> list:
  """One-shot helper: load --model, fill the masks of `text`."""
  return FillMask(*load(model_path, step))(text, top_k)


def format_result(result: list) -> str:
  rows = result if result and isinstance(result[0], list) else [result]
  lines = []
  for i, row in enumerate(rows):
    if len(rows) > 1:
      lines.append(f"[MASK] #{i + 1}:")
    for r in row:
      lines.append(f"  {r['score']:8.4f}  {r['token_str']!s:<20}  "
                   f"{r['sequence']}")
  return "\n".join(lines)
