"""An independent fine-tuning loop in PyTorch, for per-step loss parity.

`train_losses` trains a Hugging Face model with ``torch.optim.AdamW`` (no
weight decay on biases and LayerNorm, as BERT and bert_jax), a ``LambdaLR``
linear warmup + linear decay and global-norm clipping with the norm in
float64 (torch's float32 norm reads low, see docs/stack notes), on batches
saved by `save_batches`; the loss of a batch is the caller's. Nothing of
bert_jax is imported.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np


def save_batches(path: str, batches) -> str:
  np.savez(path, **{f"{i}/{k}": v for i, b in enumerate(batches)
                    for k, v in b.items()})
  return path


def load_batches(path: str) -> list[dict]:
  data = np.load(path)
  n = 1 + max(int(k.split("/")[0]) for k in data.files)
  return [{k.split("/")[1]: data[k] for k in data.files
           if k.startswith(f"{i}/")} for i in range(n)]


@contextlib.contextmanager
def one_thread():
  """Torch on one thread, as before afterwards: the models here are tiny,
  and two threads on two busy cores run ~10x slower than one."""
  import torch  # pylint: disable=g-import-not-at-top
  before = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.set_num_threads(before)


def train_losses(model, batch_path: str, loss_fn, *, lr, warmup, steps,
                 betas, eps, weight_decay, max_grad_norm, clip=True):
  """Per-step losses of `loss_fn(model, torch batch)` under AdamW."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  torch.set_num_threads(1)  # Two threads on two busy cores crawl.
  model.train()
  named = list(model.named_parameters())
  plain = lambda n: n.endswith("bias") or "LayerNorm" in n
  opt = torch.optim.AdamW(
      [dict(params=[p for n, p in named if not plain(n)],
            weight_decay=weight_decay),
       dict(params=[p for n, p in named if plain(n)], weight_decay=0.0)],
      lr=lr, betas=tuple(betas), eps=eps)

  def factor(step):  # Linear warmup to 1, then linear decay to 0.
    if step < warmup:
      return step / max(1, warmup)
    return max(0.0, (steps - step) / max(1, steps - warmup))

  schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
  losses = []
  for batch in load_batches(batch_path)[:steps]:
    batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    loss = loss_fn(model, batch)
    opt.zero_grad()
    loss.backward()
    if clip:
      norm = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                           for p in model.parameters() if p.grad is not None))
      if norm > max_grad_norm:
        for p in model.parameters():
          if p.grad is not None:
            p.grad.mul_(max_grad_norm / norm)
    opt.step()
    schedule.step()
    losses.append(float(loss.detach()))
  return np.array(losses)
