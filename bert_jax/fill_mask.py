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

import json
import sys
from typing import Any

import numpy as np

from bert_jax import pretrained
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files

# transformers' clean_up_tokenization, for HF directories that ask for it.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
            (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
            (" 're", "'re"))


def load(path: str, step: int | None = None):
  """-> (params, model config, LoadedTokenizer, family) for any --model."""
  source = pretrained.resolve(path, step)
  tokenizer = pretrained.load_tokenizer(
      pretrained.resolve(f"{path}/generator")
      if source.kind == pretrained.ELECTRA else source)
  generator = pretrained.electra_generator(source)
  if generator is not None:  # ELECTRA: the generator is the MLM.
    return (*generator, tokenizer, "electra_generator")
  model_config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, model_config)
  return params, model_config, tokenizer, "bert"


class FillMask:
  """A jitted float32 forward pass plus the pipeline's post-processing."""

  def __init__(self, params, model_config,
               tokenizer: tokenizer_files.LoadedTokenizer,
               family: str = "bert"):
    import jax
    from flax import nnx
    model = mapping.make_model(
        params, model_config, dtype="float32",
        family=family if family and family != "bert" else
        mapping.family_of_params(params))
    graphdef, state = nnx.split(model)
    self._state = state

    @jax.jit
    def logits_fn(state, ids, mask, seg):
      model = nnx.merge(graphdef, state)
      out = model(ids, mask, seg, deterministic=True)
      return jax.nn.softmax(out["mlm_logits"].astype(jax.numpy.float32),
                            axis=-1)

    self._probs = logits_fn
    self.tokenizer = tokenizer
    self.vocab_size = int(model_config.vocab_size)

  def _decode(self, ids, skip_special_tokens: bool) -> str:
    text = self.tokenizer.tokenizer.decode(
        [int(i) for i in ids], skip_special_tokens=skip_special_tokens)
    if self.tokenizer.clean_up_tokenization_spaces:
      for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text

  def __call__(self, text: str, top_k: int = 5) -> list:
    tok = self.tokenizer
    enc = tok.tokenizer.encode(text)
    ids = np.asarray([enc.ids], np.int32)
    mask_id = tok.mask_token_id
    positions = np.flatnonzero(ids[0] == mask_id)
    if not len(positions):
      raise ValueError(f"No {tok.mask_token} token in the text: {text!r}")
    seg = np.asarray([enc.type_ids], np.int32)
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


def main(argv: list[str] | None = None) -> int:
  import argparse
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.fill_mask",
      description="Predict the [MASK] tokens of a text with a BERT model.")
  parser.add_argument("--model", required=True,
                      help="Training workdir, HF directory, or converted dir.")
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step of a workdir (default: latest).")
  parser.add_argument("--top_k", type=int, default=5)
  parser.add_argument("--json", action="store_true",
                      help="Print the HF pipeline-shaped list as JSON.")
  parser.add_argument("text", nargs="+", help="Text with [MASK] tokens.")
  args = parser.parse_args(argv)
  runner = FillMask(*load(args.model, args.step))
  texts = args.text
  outputs: list[Any] = [runner(t, args.top_k) for t in texts]
  if args.json:
    print(json.dumps(outputs[0] if len(outputs) == 1 else outputs))
  else:
    for t, out in zip(texts, outputs):
      print(t)
      print(format_result(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
