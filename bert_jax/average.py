"""Average the parameters of chosen checkpoint steps of one run.

  python -m bert_jax.average --workdir W --steps 100,200,300 --output OUT
  python -m bert_jax.average --workdir W --best 3 --by eval_loss \
      [--after_step S] [--include_last] --output OUT
  python -m bert_jax.average --workdir W --best 3 --by main_score \
      --sweep SWEEP/checkpoint_sweep.json --output OUT

--steps: steps of W (or step directories of W). --best N: the N best steps
after --after_step by --by, a metric each step recorded in its meta by an
eval at that step (`eval_loss`, `eval_mlm_accuracy`, ...; losses lowest
first, other metrics highest), or with --sweep a column of a downstream
sweep of W (tools/eval_checkpoints.py); --include_last adds W's newest step
(ModernBERT: its annealing's 3 best with the final one). OUT is a workdir
with one step, the newest chosen, holding the element-wise mean of the
params (`bert_jax.checkpoints.averaging`), W's config and tokenizer and
OUT/averaged.json (which run, steps and scores). --ema: the moving averages
a run with train.ema_decay kept at those steps instead of their params (one
step: its average as it is). It exports and fine-tunes
like any run:
  python -m bert_jax.to_hf --workdir OUT --output OUT_HF
  python -m bert_jax.finetune ... --config.train.init_from=OUT
Steps of different runs, objectives or parameter shapes are refused in one
line, before anything is written.
"""

import dataclasses
import logging
import sys

from absl import flags

from bert_jax import cli
from bert_jax.checkpoints import averaging


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  define = dict(flag_values=flag_values)
  cli.define_workdir("The run whose steps are averaged.", **define)
  cli.define_output("The workdir to write (new).", **define)
  flags.DEFINE_list("steps", [], "Steps (or step directories) of --workdir.",
                    **define)
  flags.DEFINE_integer("best", 0, "Average the N best steps by --by.",
                       **define)
  flags.DEFINE_string("by", "eval_loss", "The metric --best ranks by.",
                      **define)
  flags.DEFINE_integer("after_step", 0, "--best: only steps after this one.",
                       **define)
  flags.DEFINE_bool("include_last", False, "Add the run's newest step.",
                    **define)
  flags.DEFINE_string("sweep", "", "--best: a checkpoint_sweep.json of "
                      "--workdir to rank by.", **define)
  flags.DEFINE_bool("ema", False, "Average the steps' moving averages of "
                    "the params (train.ema_decay) instead of the params.",
                    **define)
  cli.define_verbose(**define)


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  # Errors and warnings only: Orbax logs INFO lines for every read.
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(message)s", force=True)
  try:
    averaging.check_output(args.output)
    choice = averaging.choose(
        args.workdir, args.steps, best=args.best, by=args.by,
        after_step=args.after_step, include_last=args.include_last,
        sweep=args.sweep)
    if args.ema:
      choice = dataclasses.replace(choice, of="ema")
    params, config = averaging.average(choice)
    written = averaging.write(args.output, choice, params, config)
  except (ValueError, OSError) as e:  # Wrong steps or paths: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  scores = "".join(f" ({choice.by}: " + ", ".join(
      f"{s} {v:.4f}" for s, v in choice.scores) + ")" if choice.by else "")
  print(f"Wrote {written}: the mean of steps {list(choice.steps)} of "
        f"{choice.workdir}{scores}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
