"""ModernBERT's pretraining schedule at demo scale (docs/recipes.md).

The shape of Warner et al. 2024's run, on a 4 x 256 ModernBERT and the demo
corpus: 30% masking with the global batch warmed up 8 -> 16 -> 24 -> 32 by
tokens (ModernBERT: 768 -> 4,608 over 50B tokens, equal steps per size), a
stable phase at 30%, then a decay phase at 15% masking; warmup-stable-decay
with a 1-sqrt decay, counted in tokens; a checkpoint with its held-out loss
every 25 steps, all kept, to average the annealing's best with the last.

Run, then average the decay phase's 3 best steps with the final one:
  python -m bert_jax.main --config configs/modernbert_recipe.py \
      --workdir /tmp/mb_recipe
  python -m bert_jax.average --workdir /tmp/mb_recipe --best 3 \
      --by eval_loss --after_step 300 --include_last --output /tmp/mb_avg
  python -m bert_jax.to_hf --workdir /tmp/mb_avg --output /tmp/mb_avg_hf
Each phase's batches as measured (mask rate):
  python tools/inspect_data.py --config configs/modernbert_recipe.py \
      --workdir /tmp/mb_recipe --phase 3 --num_batches 20 --num_show 0
"""

from bert_jax.objectives import modernbert

SEQ = 64
WARMUP = dict(start=8, increment=8, tokens=20 * SEQ * (8 + 16 + 24))
# (steps, mask rate, max_predictions_per_seq): 30% of 62 maskable tokens
# rounds to 19; 15% to 9.
PHASES = ((150, 0.30, 20), (150, 0.30, 20), (100, 0.15, 10))


def get_config():
  config = modernbert.published_config("base")
  config.model.update(
      vocab_size=4000, hidden_size=256, num_hidden_layers=4,
      num_attention_heads=4, intermediate_size=384,
      max_position_embeddings=128, local_attention=32, dtype="float32")
  config.data.update(tokenizer_vocab_size=4000, seq_length=SEQ,
                     max_predictions_per_seq=20)
  t = config.train
  t.num_steps = sum(steps for steps, _, _ in PHASES)
  t.batch_size = 32
  t.learning_rate = 1e-3
  t.weight_decay = 1e-5 / t.learning_rate  # ModernBERT's decoupled 1e-5.
  t.phases = tuple(
      dict(num_steps=steps, seq_length=SEQ, max_predictions_per_seq=preds,
           batch_size=32, data=dict(mask_rate=rate),
           **(dict(batch_warmup=WARMUP) if i == 0 else {}))
      for i, (steps, rate, preds) in enumerate(PHASES))
  t.phase_data = "continue"  # One stream of documents through the phases.
  t.phase_schedule = "continuous"  # One warmup-stable-decay over the run.
  t.schedule, t.decay_shape, t.schedule_unit = "wsd", "1-sqrt", "tokens"
  t.warmup_tokens = 30_720  # 15 steps' worth at the full batch.
  t.decay_tokens = PHASES[-1][0] * 32 * SEQ  # The decay phase's tokens.
  t.log_every = 25
  t.eval_every = 25
  config.checkpoint.save_every_steps = 25
  config.checkpoint.keep_period = 25  # Every step is a candidate to average.
  return config
