"""Entity-level precision / recall / F1 with conlleval's semantics.

An entity (chunk) is a maximal run of tags that conlleval's ``startOfChunk``
/ ``endOfChunk`` rules group together; a predicted entity is correct only
when a gold entity has the same first word, last word and type. The rules
are conlleval's, which read IOB1, IOB2 and BIOES alike:

* a chunk starts at ``B-`` or ``S-``, at ``I-`` / ``E-`` after ``O``, ``E-``
  or ``S-``, and wherever the type changes (so ``I-`` without ``B-`` starts
  an entity, and ``B-PER I-LOC`` is two);
* a chunk ends before ``B-``, ``S-`` and ``O``, after ``E-`` and ``S-``, and
  wherever the type changes (so IOB1's ``I-LOC I-LOC B-LOC`` is two
  entities, as is IOB2's ``B-LOC I-LOC B-LOC``).

Sentences are scored separately (conlleval's blank line). Micro precision,
recall and F1 count entities over all types; per type too; accuracy is over
all words, ``O`` included (conlleval's "accuracy"). With nothing predicted
(or no gold entity) the undefined ratios are 0, as conlleval prints them.
"""

from __future__ import annotations

import collections
from typing import Sequence


def _split(tag: str) -> tuple[str, str]:
  """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
  if tag == "O" or "-" not in tag:
    return "O", ""
  prefix, kind = tag.split("-", 1)
  return prefix, kind


def _ends(prev: str, tag: str, prev_type: str, kind: str) -> bool:
  """conlleval's endOfChunk: does the chunk of `prev` end before `tag`?"""
  return (prev in ("E", "S") or
          (prev in ("B", "I") and tag in ("B", "S", "O")) or
          (prev != "O" and prev_type != kind))


def _starts(prev: str, tag: str, prev_type: str, kind: str) -> bool:
  """conlleval's startOfChunk: does a chunk start at `tag`?"""
  return (tag in ("B", "S") or
          (prev in ("E", "S", "O") and tag in ("E", "I")) or
          (tag != "O" and prev_type != kind))


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """The chunks of one sentence as (type, first word, last word)."""
  out, start, kind_open = [], None, ""
  prev, prev_type = "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, kind = _split(tag)
    if start is not None and _ends(prev, prefix, prev_type, kind):
      out.append((kind_open, start, i - 1))
      start = None
    if _starts(prev, prefix, prev_type, kind) and prefix != "O":
      start, kind_open = i, kind
    prev, prev_type = prefix, kind
  return out


def _prf(correct: float, found_pred: float, found_gold: float) -> dict:
  p = correct / found_pred if found_pred else 0.0
  r = correct / found_gold if found_gold else 0.0
  return dict(precision=p, recall=r, f1=2 * p * r / (p + r) if p + r else 0.0)


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]
                  ) -> dict:
  """conlleval's numbers over sentences of gold and predicted tags.

  Returns dict(precision, recall, f1, accuracy, per_type={type:
  dict(precision, recall, f1, support, predicted)}, entities, predicted,
  words).
  """
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold sentences, {len(pred)} predicted.")
  hits, n_gold, n_pred = (collections.Counter() for _ in range(3))
  right = words = 0
  for g, p in zip(gold, pred):
    if len(g) != len(p):
      raise ValueError(f"A sentence has {len(g)} gold tags and {len(p)} "
                       "predicted.")
    right += sum(a == b for a, b in zip(g, p))
    words += len(g)
    eg, ep = set(entities(g)), set(entities(p))
    n_gold.update(e[0] for e in eg)
    n_pred.update(e[0] for e in ep)
    hits.update(e[0] for e in eg & ep)
  per_type = {
      t: dict(_prf(hits[t], n_pred[t], n_gold[t]), support=n_gold[t],
              predicted=n_pred[t])
      for t in sorted(set(n_gold) | set(n_pred))}
  out = _prf(sum(hits.values()), sum(n_pred.values()), sum(n_gold.values()))
  out.update(accuracy=right / words if words else 0.0, per_type=per_type,
             entities=sum(n_gold.values()), predicted=sum(n_pred.values()),
             words=words)
  return out


def conll_lines(words: Sequence[Sequence[str]], gold: Sequence[Sequence[str]],
                pred: Sequence[Sequence[str]]) -> list[str]:
  """``word gold predicted`` per line, a blank line after each sentence:
  the input conlleval reads (``conlleval < predictions.conll``). Whitespace
  inside a word (possible in JSONL tokens) becomes "_"."""
  lines = []
  for ws, gs, ps in zip(words, gold, pred):
    lines += [f"{'_'.join(w.split()) or '_'} {g} {p}"
              for w, g, p in zip(ws, gs, ps)]
    lines.append("")
  return lines
