"""Fill in [MASK] tokens with a pretrained model: the zero-shot check of BERT.

  python -m bert_jax.fill_mask --model WORKDIR_OR_HF_DIR [--top_k 5] [--json] \
      "Elephants are playing in the zoo with monkeys. The story is about [MASK]."

--model is a training workdir (latest checkpoint, or --step; an ELECTRA
run fills with its generator), an ELECTRA export (discriminator/ +
generator/), a Hugging Face BERT, ALBERT or DistilBERT directory (ours
from tools/convert_to_hf.py, or anyone's), a Google TF
checkpoint directory, or a tools/convert_from_hf.py output. The model runs in
JAX (float32); tokenization uses the `tokenizers` library with the same
tokenizer.json an export writes, so no TensorFlow and no torch are imported.
The result has the shape of transformers' pipeline("fill-mask") output:
a list of {score, token, token_str, sequence} per mask (a list of such lists
when the text has several masks).
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from flax import nnx

from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files

# transformers' clean_up_tokenization, for HF directories that ask for it.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
            (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
            (" 're", "'re"))


def load(path: str, step: int | None = None):
  """-> (params, model config, LoadedTokenizer, family) for any --model:
  its run's masked LM (``objectives.masked_lm``; ELECTRA's generator)."""
  source = pretrained.resolve(path, step)
  params, _ = pretrained.load_params(source)
  model = objectives.masked_lm(source.config, params)
  return (model.params, model.model_config, pretrained.load_tokenizer(source),
          model.family)


class FillMask:
  """A jitted float32 forward pass plus the pipeline's post-processing."""

  def __init__(self, params, model_config,
               tokenizer: tokenizer_files.LoadedTokenizer,
               family: str = "bert"):
    model = mapping.make_model(params, model_config, dtype="float32",
                               family=family)
    graphdef, state = nnx.split(model)
    self._state = state

    # The embedding table may be padded past the tokenizer's pieces (a
    # vocab_size rounded up, or a small corpus's SentencePiece model): those
    # rows are no token and are never returned. Probabilities stay a softmax
    # over the whole table, as Hugging Face's fill-mask pipeline computes
    # them, so scores agree with it.
    self.vocab_size = min(int(model_config.vocab_size),
                          int(tokenizer.tokenizer.get_vocab_size()))
    self.max_positions = int(model_config.max_position_embeddings)
    n = self.vocab_size

    @jax.jit
    def logits_fn(state, ids, mask, seg):
      model = nnx.merge(graphdef, state)
      out = model(ids, mask, seg, deterministic=True)
      logits = out["mlm_logits"].astype(jax.numpy.float32)
      real = jax.numpy.arange(logits.shape[-1]) < n
      return jax.numpy.where(real, jax.nn.softmax(logits, axis=-1), 0.0)

    self._probs = logits_fn
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

  def __call__(self, text: str, top_k: int = 5) -> list:
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
    positions = np.flatnonzero(ids[0] == mask_id)
    probs = np.asarray(self._probs(self._state, ids, np.ones_like(ids), seg))
    top_k = min(top_k, self.vocab_size)
    single = len(positions) == 1
    result = []
    for pos in positions:
      p = probs[0, pos]
      # Descending probability; ties by lower id (torch.topk's order).
      order = np.lexsort((np.arange(len(p)), -p))[:top_k]
      row = []
      for t in order:
        filled = ids[0].copy()
        filled[pos] = t
        if tok.pad_token_id is not None:
          filled = filled[filled != tok.pad_token_id]
        row.append({"score": float(p[t]), "token": int(t),
                    "token_str": self._decode([t], False),
                    "sequence": self._decode(filled, single)})
      result.append(row)
    return result[0] if single else result


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
