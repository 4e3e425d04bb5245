r"""Ours under other settings, side by side with the config as given.

  python tools/bench_variants.py --config configs/small.py \
      --variant=fused:model.fused_qkv=True \
      --variant=dpa:model.attention_impl=dot_product_attention,model.attention_probs_dropout_prob=0.0 \
      --variant=full_logits:gather=False [--steps 3 --rounds 3] [--json]

Each --variant is NAME:group.field=VALUE,... applied to a copy of the
config; the pseudo-key `gather=False` trains BERT's objective with
vocabulary logits at every position (as Hugging Face's head does), then the
masked ones picked for the same loss: the ablation of our masked-position
gather. The base config and every variant compile first, then alternate,
`--steps` timed steps each for `--rounds` rounds after `--warmup` untimed
ones (`bert_jax.benchmarking`). Prints tokens/s, the ratio to the base,
MFU, compile time and step memory per variant.
"""

from __future__ import annotations

import ast
import dataclasses
import json

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax import compose
from bert_jax.objectives import bert
from bert_jax.training import utilization

FLAGS = flags.FLAGS


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (configs/*.py) and overrides: the base.",
                    argv=argv, lock_config=False, **define)
  flags.DEFINE_multi_string(
      "variant", [], "NAME:group.field=VALUE,... e.g. "
      "--variant=fused:model.fused_qkv=True (gather=False: logits at every "
      "position).", **define)
  cli.define_timing(**define)
  flags.DEFINE_bool("json", False, "Print one JSON object.", **define)


def parse_variant(text: str):
  """"name:model.fused_qkv=True,model.dtype=bfloat16" -> (name, overrides)."""
  name, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    key, _, value = item.partition("=")
    try:
      overrides[key.strip()] = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      overrides[key.strip()] = value.strip()
  return name, overrides


def full_logits_objective():
  """Ablation of the masked-position gather: BERT's objective with
  vocabulary logits at every position (as HF), then the masked ones picked
  for the same loss. Plugged into the train step like any objective."""

  def loss_sums(model, batch, rng, deterministic, config):
    del config
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    out = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                None, deterministic=deterministic, rngs=rngs)
    mlm_logits = jnp.take_along_axis(
        out["mlm_logits"], batch["masked_lm_positions"][..., None], axis=1)
    return {**bert.mlm_sums(mlm_logits, batch),
            **bert.pair_sums(out["nsp_logits"], batch["next_sentence_labels"])}

  return dataclasses.replace(bert.OBJECTIVE, name="bert_full_logits",
                             loss_sums=loss_sums)


def compare_variants(config, variants: list[str], steps: int, rounds: int,
                     warmup: int) -> dict:
  """Ours under several overrides, alternating, each vs the first (base)."""
  runners = []
  for text in ["base:"] + list(variants):
    name, overrides = parse_variant(text)
    c = config.copy_and_resolve_references()
    gather = overrides.pop("gather", True)
    for key, value in overrides.items():
      group, field = key.split(".", 1)
      c[group][field] = value
    objective = None if gather else full_logits_objective()
    runners.append((name, c, benchmarking.Ours(c, objective=objective,
                                               name=name)))
  benchmarking.alternate([r for *_, r in runners], warmup=warmup,
                         rounds=rounds, steps=steps)
  tokens = config.train.batch_size * config.data.seq_length
  out = {}
  for name, c, r in runners:
    p50 = benchmarking.stats(r.times)["p50"]
    peak, _ = utilization.peak_tflops(c.model.dtype, c.train.peak_tflops)
    _, mfu = utilization.mfu(compose.train_flops_per_step(c), p50,
                             jax.device_count(), peak)
    out[name] = dict(tokens_per_sec=tokens / p50, step_time_p50=p50, mfu=mfu,
                     compile_seconds=r.compile_seconds,
                     peak_memory_mb=r.memory_mb)
  base = out["base"]["tokens_per_sec"]
  for v in out.values():
    v["vs_base"] = v["tokens_per_sec"] / base
  return out


def main(argv):
  del argv
  r = compare_variants(FLAGS.config, FLAGS.variant, FLAGS.steps, FLAGS.rounds,
                       FLAGS.warmup)
  if FLAGS.json:
    print(json.dumps(r))
    return
  for name, v in r.items():
    mem = v["peak_memory_mb"]
    print(f"{name:24s} tokens/s {v['tokens_per_sec']:7.0f}  "
          f"x{v['vs_base']:.2f} vs base  MFU {100*v['mfu']:.1f}%  "
          f"compile {v['compile_seconds']:.0f} s  step memory "
          f"{mem if mem is None else round(mem)} MB")


if __name__ == "__main__":
  cli.run(main, define_flags)
