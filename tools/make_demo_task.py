r"""A small downstream task from the demo corpus: which doc topic a sentence is from.

  python tools/make_demo_task.py --output /tmp/demo_task
  # -> /tmp/demo_task/train.csv, dev.csv (columns text,label)

Sentences of four CPython documentation topics (`pydoc_data.topics`, present
on every machine, the text configs/demo.py pretrains on) labelled with their
topic; every 5th sentence of each topic goes to dev.csv (1,264 train and 318
dev rows; 17 of the 314 distinct dev sentences, short code lines that the
docs repeat, also occur in train). Sentences vary in
length (a few tokens to over 100), which is what length buckets are for.
Used by docs/downstream.md's demo fine-tuning comparison ("Fine-tuning
both demos on the same task") and tools/bench_finetune.py.

  python tools/make_demo_task.py --output /tmp/short_task --lengths sst2

The same topics cut into short phrases of SST-2-like lengths instead: word
counts drawn from a log-normal of median 10 words (sigma 0.6, 2 to 50
words), consecutive words of the topic's text, the same 1-in-5 dev split
(seeded: the same files every time). What packing is for: most rows of a
32-slot bucket are padding.
"""

import csv
import os
import sys

from absl import flags

from bert_jax import cli

TOPICS = ("compound", "debugger", "formatstrings", "string-methods")
DEV_EVERY = 5


def task_rows(topics=TOPICS, min_words: int = 3):
  """{"train": [(text, topic)], "dev": [...]}, in corpus order."""
  from bert_jax.data import demo_corpus  # pylint: disable=g-import-not-at-top
  docs = dict(demo_corpus.demo_documents())
  missing = [t for t in topics if t not in docs]
  if missing:
    raise ValueError(f"Topics {missing} are not in pydoc_data.topics.")
  out = {"train": [], "dev": []}
  for topic in topics:
    sents = [s for s in docs[topic] if len(s.split()) >= min_words]
    for i, s in enumerate(sents):
      out["dev" if i % DEV_EVERY == 0 else "train"].append((s, topic))
  return out


def short_rows(topics=TOPICS, median_words: float = 10.0, seed: int = 0):
  """{"train": [(phrase, topic)], "dev": [...]}: each topic's text cut into
  consecutive phrases of log-normal word counts (SST-2-like lengths)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.data import demo_corpus  # pylint: disable=g-import-not-at-top
  docs = dict(demo_corpus.demo_documents())
  rng = np.random.default_rng(seed)
  out = {"train": [], "dev": []}
  for topic in topics:
    words = " ".join(docs[topic]).split()
    i = k = 0
    while i < len(words):
      n = int(np.clip(round(rng.lognormal(np.log(median_words), 0.6)), 2, 50))
      phrase = " ".join(words[i:i + n])
      i += n
      out["dev" if k % DEV_EVERY == 0 else "train"].append((phrase, topic))
      k += 1
  return out


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_output("Output directory.", flag_values=flag_values,
                    aliases=("out",))
  flags.DEFINE_enum("lengths", "sentences", ["sentences", "sst2"], "Whole "
                    "sentences, or short phrases of SST-2-like lengths "
                    "(median 10 words).", flag_values=flag_values)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  os.makedirs(args.output, exist_ok=True)
  rows = task_rows() if args.lengths == "sentences" else short_rows()
  for split, rows in rows.items():
    path = os.path.join(args.output, f"{split}.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
      w = csv.writer(f)
      w.writerow(["text", "label"])
      w.writerows(rows)
    print(f"{path}: {len(rows)} rows")
  return 0


if __name__ == "__main__":
  sys.exit(main())
