r"""A Hugging Face peer of tools/benchmark.py, in its own process and Python.

  python tools/bench_peer.py KIND SPEC_JSON

Started by tools/benchmark.py --compare in a Python with the peer's pins
(transformers + torch, or transformers 4.57.6 + jax for HF Flax): it imports
numpy and the peer's framework only, never bert_jax. KIND is ``torch`` or
``flax``; SPEC_JSON gives the Hugging Face config (``bert_config``), the
family, the dtype, ``sparse_prediction`` (MLM logits at the labelled
positions only: ModernBERT's config option; RoBERTa / XLM-R have none, so
their encoder and LM head are called on the gathered positions) and
``batches``, an .npz of the batches ours times
(google-research/bert layout, ``{i}/{feature}``), so both sides train on the
same arrays. Each peer trains as it ships: AdamW (lr 1e-4, weight decay
0.01), its own MLM head, its dropout; bf16 is HF Flax's computation dtype or
``torch.autocast("cpu", bfloat16)``.

Protocol: after building the model and running one step (compile for Flax,
allocator warm-up for torch) it prints one JSON line (framework, setup and
first-step seconds); then for every integer N read on stdin it runs N steps
and prints one JSON line with their times and its peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np


def read_batches(path: str) -> list[dict]:
  """The .npz tools/benchmark.py writes: {i}/{feature} -> [batch, ...]."""
  with np.load(path) as z:
    out = {}
    for key in z.files:
      i, name = key.split("/", 1)
      out.setdefault(int(i), {})[name] = z[key]
  return [out[i] for i in sorted(out)]


def labels_full(b: dict) -> np.ndarray:
  """[B,T] MLM labels with -100 at unmasked positions (HF convention)."""
  labels = np.full(b["input_ids"].shape, -100, np.int64)
  for i in range(labels.shape[0]):
    for p, t, w in zip(b["masked_lm_positions"][i], b["masked_lm_ids"][i],
                       b["masked_lm_weights"][i]):
      if w > 0:
        labels[i, p] = t
  return labels


# RoBERTa-architecture families -> their transformers class prefix.
ROBERTA_CLASSES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}


def torch_model(spec: dict):
  """The PyTorch model of `spec`, initialized from seed 0, in train mode:
  ModernBertForMaskedLM (MLM only; sdpa with its own local + global masks;
  `sparse_prediction`: MLM logits at the labelled positions only) or
  BertForPreTraining."""
  import torch  # pylint: disable=g-import-not-at-top  (the peer's Python)
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  if spec.get("family") in ROBERTA_CLASSES:
    cfg = getattr(transformers, ROBERTA_CLASSES[spec["family"]] + "Config")(
        **{k: v for k, v in spec["bert_config"].items()
           if k not in ("architectures", "model_type", "dtype")})
    return getattr(transformers,
                   ROBERTA_CLASSES[spec["family"]] + "ForMaskedLM")(
                       cfg).train()
  if spec.get("family") == "modernbert":
    cfg = transformers.ModernBertConfig(
        sparse_prediction=bool(spec.get("sparse_prediction", False)),
        **{k: v for k, v in spec["bert_config"].items()
           if k not in ("architectures", "model_type", "dtype")})
    return transformers.ModernBertForMaskedLM._from_config(  # pylint: disable=protected-access
        cfg, attn_implementation="sdpa").train()
  cfg = transformers.BertConfig(**spec["bert_config"])
  return transformers.BertForPreTraining(cfg).train()


def torch_batches(spec: dict) -> list[dict]:
  """The batches of `spec` as the PyTorch model's inputs."""
  import torch  # pylint: disable=g-import-not-at-top  (the peer's Python)
  batches = []
  for b in read_batches(spec["batches"]):
    batch = dict(
        input_ids=torch.from_numpy(b["input_ids"]).long(),
        attention_mask=torch.from_numpy(b["input_mask"]).long(),
        labels=torch.from_numpy(labels_full(b)))
    if spec.get("family") in ROBERTA_CLASSES and spec.get(
        "sparse_prediction"):
      # The masked positions only (the step gathers them itself).
      batch = dict(
          input_ids=batch["input_ids"],
          attention_mask=batch["attention_mask"],
          positions=torch.from_numpy(b["masked_lm_positions"]).long(),
          targets=torch.from_numpy(b["masked_lm_ids"]).long(),
          weights=torch.from_numpy(b["masked_lm_weights"]).float())
    elif spec.get("family") not in ("modernbert", *ROBERTA_CLASSES):
      batch.update(
          token_type_ids=torch.from_numpy(b["segment_ids"]).long(),
          next_sentence_label=torch.from_numpy(
              b["next_sentence_labels"]).long())
    batches.append(batch)
  return batches


def roberta_sparse_loss(model, b):
  """A RobertaForMaskedLM's MLM loss with its LM head on the masked
  positions only: its encoder, then its ``lm_head`` on the gathered states
  (transformers has no option for it)."""
  import torch  # pylint: disable=g-import-not-at-top  (the peer's Python)
  states = model.roberta(input_ids=b["input_ids"],
                         attention_mask=b["attention_mask"]).last_hidden_state
  at = torch.gather(states, 1, b["positions"][..., None].expand(
      -1, -1, states.size(-1)))
  logits = model.lm_head(at).float()
  nll = torch.nn.functional.cross_entropy(
      logits.transpose(1, 2), b["targets"], reduction="none")
  return (nll * b["weights"]).sum() / b["weights"].sum().clamp(min=1.0)


def torch_peer(spec: dict):
  import torch  # pylint: disable=g-import-not-at-top  (the peer's Python)
  import transformers  # pylint: disable=g-import-not-at-top

  model = torch_model(spec)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  bf16 = spec["dtype"] == "bfloat16"
  batches = torch_batches(spec)

  sparse = (spec.get("family") in ROBERTA_CLASSES
            and spec.get("sparse_prediction"))

  def step(b):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
      loss = roberta_sparse_loss(model, b) if sparse else model(**b).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())

  return step, batches, dict(framework=f"torch {torch.__version__}, "
                             f"transformers {transformers.__version__}",
                             threads=torch.get_num_threads())


def flax_peer(spec: dict):
  import jax  # pylint: disable=g-import-not-at-top  (the peer's Python)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  cfg = transformers.BertConfig(**spec["bert_config"])
  dtype = jnp.bfloat16 if spec["dtype"] == "bfloat16" else jnp.float32
  model = transformers.FlaxBertForPreTraining(cfg, seed=0, dtype=dtype)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  params = model.params
  opt_state = tx.init(params)

  def loss_fn(params, b, rng):
    out = model(b["input_ids"], attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"], params=params,
                dropout_rng=rng, train=True)
    logits = out.prediction_logits.astype(jnp.float32)  # [B, T, V]
    labels = b["labels"]
    w = (labels >= 0).astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.maximum(labels, 0))
    mlm = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32),
        b["next_sentence_label"]).mean()
    return mlm + nsp

  @jax.jit
  def train_step(params, opt_state, b, rng):
    rng, sub = jax.random.split(rng)
    loss, grads = jax.value_and_grad(loss_fn)(params, b, sub)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, rng

  state = dict(params=params, opt_state=opt_state, rng=jax.random.key(0))
  batches = []
  for b in read_batches(spec["batches"]):
    batches.append(jax.device_put(dict(
        input_ids=b["input_ids"], attention_mask=b["input_mask"],
        token_type_ids=b["segment_ids"],
        labels=labels_full(b).astype(np.int32),
        next_sentence_label=b["next_sentence_labels"])))

  def step(b):
    state["params"], state["opt_state"], loss, state["rng"] = train_step(
        state["params"], state["opt_state"], b, state["rng"])
    return float(loss)

  return step, batches, dict(framework=f"jax {jax.__version__}, "
                             f"transformers {transformers.__version__}")


def serve(kind: str, spec_json: str) -> None:
  """The protocol above, on stdin / stdout."""
  spec = json.loads(spec_json)
  start = time.perf_counter()
  step, batches, info = (torch_peer if kind == "torch" else flax_peer)(spec)
  setup = time.perf_counter() - start
  start = time.perf_counter()
  step(batches[0])  # First step: compile (flax) / allocator warm-up (torch).
  info.update(setup_seconds=setup,
              compile_seconds=time.perf_counter() - start)
  print(json.dumps(info), flush=True)
  i = 1
  for line in sys.stdin:
    times = []
    for _ in range(int(line)):
      start = time.perf_counter()
      step(batches[i % len(batches)])
      times.append(time.perf_counter() - start)
      i += 1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(dict(times=times, max_rss_mb=rss)), flush=True)


if __name__ == "__main__":
  if len(sys.argv) != 3 or sys.argv[1] not in ("torch", "flax"):
    sys.exit("usage: python tools/bench_peer.py torch|flax SPEC_JSON "
             "(started by tools/benchmark.py --compare)")
  serve(sys.argv[1], sys.argv[2])
