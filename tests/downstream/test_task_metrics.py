"""conlleval entity scores and the official SQuAD metrics on fixed cases.

Every expected number is computed by hand in the comment beside it (or is
what conlleval / evaluate-v2.0.py print for the case); nothing is taken from
the code under test.
"""

import pytest

from bert_jax.tasks import entity_metrics
from bert_jax.tasks import squad_metrics


# --- conlleval ---------------------------------------------------------------
@pytest.mark.parametrize("tags,expected", [
    # IOB2.
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    # I- without B- starts an entity (conlleval, not seqeval's strict mode).
    (["O", "I-PER", "I-PER", "O"], [("PER", 1, 2)]),
    # A type change inside an entity splits it in two.
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
    # B after I of the same type: a new entity (IOB1's separator).
    (["I-LOC", "I-LOC", "B-LOC", "I-LOC"], [("LOC", 0, 1), ("LOC", 2, 3)]),
    # B B: two one-word entities.
    (["B-ORG", "B-ORG"], [("ORG", 0, 0), ("ORG", 1, 1)]),
    # BIOES: S is a one-word entity, E closes one, I after E starts one.
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "I-LOC", "O"],
     [("PER", 0, 0), ("LOC", 1, 3), ("LOC", 4, 4)]),
    (["E-MISC", "O"], [("MISC", 0, 0)]),
    (["O", "O"], []),
])
def test_conlleval_chunks(tags, expected):
  assert entity_metrics.entities(tags) == expected


def test_iob1_and_its_iob2_conversion_give_the_same_entities():
  iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "O", "I-ORG"]
  iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O", "B-ORG"]
  assert entity_metrics.entities(iob1) == entity_metrics.entities(iob2) == [
      ("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 5), ("ORG", 7, 7)]


def test_entity_scores_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-PER"]]
  pred = [["B-PER", "I-PER", "O", "B-ORG"],  # PER right, LOC->ORG wrong
          ["B-ORG", "I-ORG", "B-PER"]]       # ORG too long, PER right
  s = entity_metrics.entity_scores(gold, pred)
  # gold entities: PER, LOC, ORG, PER = 4; predicted: PER, ORG, ORG, PER = 4;
  # correct: PER (0,1) and PER (2,2) = 2 -> P = R = F1 = 0.5.
  assert (s["precision"], s["recall"], s["f1"]) == (0.5, 0.5, 0.5)
  # words: 7, right tags: 5 (all but B-LOC->B-ORG and O->I-ORG).
  assert s["accuracy"] == pytest.approx(5 / 7)
  assert s["per_type"]["PER"] == dict(precision=1.0, recall=1.0, f1=1.0,
                                      support=2, predicted=2)
  # ORG: gold 1, predicted 2, correct 0; LOC: gold 1, predicted 0.
  assert s["per_type"]["ORG"]["precision"] == 0.0
  assert s["per_type"]["ORG"]["predicted"] == 2
  assert s["per_type"]["LOC"] == dict(precision=0.0, recall=0.0, f1=0.0,
                                      support=1, predicted=0)


def test_entity_scores_precision_and_recall_differ():
  gold = [["B-PER", "O", "B-LOC", "O"]]
  pred = [["B-PER", "O", "O", "O"]]
  s = entity_metrics.entity_scores(gold, pred)
  # 1 predicted, 1 correct, 2 gold: P 1, R 0.5, F1 2/3.
  assert (s["precision"], s["recall"]) == (1.0, 0.5)
  assert s["f1"] == pytest.approx(2 / 3)
  empty = entity_metrics.entity_scores([["O", "O"]], [["O", "O"]])
  assert (empty["precision"], empty["recall"], empty["f1"]) == (0, 0, 0)
  assert empty["accuracy"] == 1.0


def test_conll_lines_are_conlleval_input():
  lines = entity_metrics.conll_lines([["Jim", "runs"], ["Paris"]],
                         [["B-PER", "O"], ["B-LOC"]],
                         [["B-PER", "O"], ["O"]])
  assert lines == ["Jim B-PER B-PER", "runs O O", "", "Paris B-LOC O", ""]


# --- SQuAD -------------------------------------------------------------------
@pytest.mark.parametrize("text,normal", [
    ("The Cat", "cat"),                      # case, article
    ("  a  dog,  an   owl.  ", "dog owl"),   # articles, punctuation, spaces
    ("Theatre of the Absurd", "theatre of absurd"),  # "the" as a word only
    ("Café—Noir!", "café—noir"),             # Unicode kept, ASCII ! removed
    ("«Ébène»", "«ébène»"),                  # guillemets are not ASCII
    ("1,000", "1000"),
    ("the", ""),
])
def test_normalize_answer_as_the_official_script(text, normal):
  assert squad_metrics.normalize_answer(text) == normal


def test_exact_and_f1_by_hand():
  assert squad_metrics.exact("The Eiffel Tower", "eiffel tower!") == 1.0
  # gold tokens [eiffel, tower], pred [tower, in, paris]: 1 common;
  # P 1/3, R 1/2, F1 = 2 * (1/6) / (5/6) = 0.4.
  assert squad_metrics.f1("the Eiffel Tower", "tower in Paris") == pytest.approx(0.4)
  # Repeated tokens count with multiplicity: gold [a1 a1 b], pred [a1 a1 a1]:
  # common 2; P 2/3, R 2/3.
  assert squad_metrics.f1("x x y", "x x x") == pytest.approx(2 / 3)
  # Empty sides: v2 gives 1 when both are empty, v1.1 gives 0.
  assert squad_metrics.f1("", "", version_2=True) == 1.0
  assert squad_metrics.f1("", "", version_2=False) == 0.0
  assert squad_metrics.f1("the", "a cat", version_2=True) == 0.0


def test_maximum_over_gold_answers():
  gold = {"q": ["Denver Broncos", "the Broncos", "Broncos"]}
  scores, _ = squad_metrics.evaluate(gold, {"q": "Broncos"}, version_2=False)
  assert scores == dict(exact=1.0, f1=1.0)
  scores, _ = squad_metrics.evaluate(gold, {"q": "Denver"}, version_2=False)
  # vs "Denver Broncos": P 1, R 1/2 -> F1 2/3 (the best of the three).
  assert scores["exact"] == 0.0 and scores["f1"] == pytest.approx(2 / 3)


def test_v2_no_answer_scoring_and_best_threshold():
  gold = {"a": ["Paris"], "b": ["in 1999"], "c": [], "d": []}
  preds = {"a": "Paris", "b": "", "c": "", "d": "London"}
  odds = {"a": -3.0, "b": 2.0, "c": 1.0, "d": -1.0}
  scores, extras = squad_metrics.evaluate(gold, preds, version_2=True, null_odds=odds)
  # exact: a 1, b 0 (answerable, predicted null), c 1 (null right), d 0.
  assert scores["exact"] == 0.5 and scores["f1"] == 0.5
  assert scores["HasAns_exact"] == 0.5 and scores["NoAns_exact"] == 0.5
  assert extras["HasAns_total"] == 2 and extras["NoAns_total"] == 2
  # find_best_thresh: start at 2 (all null: c, d right); sorted by odds:
  # a (-3): +1 -> 3 (best, thresh -3); d (-1): pred "London" -> -1 -> 2;
  # c (1): pred "" -> 0 -> 2; b (2): score 0 -> 2. Best 3/4 at -3.
  assert scores["best_exact"] == 0.75 and extras["best_exact_thresh"] == -3.0
  assert scores["best_f1"] == 0.75 and extras["best_f1_thresh"] == -3.0


def test_v2_gold_that_normalises_empty_is_a_null_answer():
  # "The" normalises to "": the gold becomes [""], but the question is still
  # answerable (it has answers), as in evaluate-v2.0.py.
  gold = {"q": ["The"]}
  scores, extras = squad_metrics.evaluate(gold, {"q": ""}, version_2=True)
  assert scores["exact"] == 1.0 and extras["HasAns_total"] == 1


def test_missing_prediction_v1_counts_zero_v2_is_left_out():
  gold = {"a": ["x"], "b": ["y"]}
  v1, _ = squad_metrics.evaluate(gold, {"a": "x"}, version_2=False)
  assert v1["exact"] == 0.5
  v2, extras = squad_metrics.evaluate(gold, {"a": "x"}, version_2=True)
  assert v2["exact"] == 1.0 and extras["missing"] == 1


# --- QA post-processing (fake logits) -----------------------------------------
def _one_question(context_offsets, windows):
  """A SpanMap of one question: `windows` = [(token_start, num_context)],
  each row [CLS] q [SEP] context... [SEP] (context at position 3)."""
  import numpy as np

  from bert_jax.data import span_features
  starts, ends = (np.array(x, np.int32) for x in zip(*context_offsets))
  n = len(windows)
  return span_features.SpanMap(
      example=np.zeros(n, np.int32), context_offset=np.full(n, 3, np.int32),
      token_start=np.array([w[0] for w in windows], np.int32),
      num_context=np.array([w[1] for w in windows], np.int32),
      char_starts=[starts], char_ends=[ends])


CONTEXT = "Hi there,  big world"
OFFSETS = [(0, 2), (3, 8), (8, 9), (11, 14), (15, 20)]  # hi there , big world


def _logits(best_start, best_end, size=9, high=5.0, extra=()):
  import numpy as np
  s, e = np.zeros(size, np.float32), np.zeros(size, np.float32)
  s[best_start], e[best_end] = high, high
  for pos, which, value in extra:
    (s if which == "s" else e)[pos] = value
  return s, e


def _answers(span_map, logits, version_2=False, **kw):
  from bert_jax.data import squad_sources
  from bert_jax.tasks import span_answers
  ex = [squad_sources.QAExample("q", "?", CONTEXT, (("big", 11),))]
  start = {f: l[0] for f, l in enumerate(logits)}
  end = {f: l[1] for f, l in enumerate(logits)}
  return span_answers.best_answers(ex, span_map, start, end,
                                   version_2=version_2, **kw)[:2]


def _nbest(span_map, logits, version_2=False, **kw):
  """The question's n-best list as (text, start logit, end logit) and the
  probabilities; checks the prediction is its first non-empty text."""
  from bert_jax.data import squad_sources
  from bert_jax.tasks import span_answers
  ex = [squad_sources.QAExample("q", "?", CONTEXT, (("big", 11),))]
  start = {f: l[0] for f, l in enumerate(logits)}
  end = {f: l[1] for f, l in enumerate(logits)}
  preds, odds, nbest = span_answers.best_answers(
      ex, span_map, start, end, version_2=version_2, **kw)
  entries = nbest["q"]
  assert all(set(e) == {"text", "probability", "start_logit", "end_logit"}
             for e in entries)
  texts = [e["text"] for e in entries if e["text"]]
  if preds["q"]:
    assert preds["q"] == texts[0]
  return ([(e["text"], e["start_logit"], e["end_logit"]) for e in entries],
          [e["probability"] for e in entries], preds["q"], odds)


def test_answer_is_cut_from_the_context_by_offsets():
  m = _one_question(OFFSETS, [(0, 5)])
  # Context token k sits at row position 3 + k.
  preds, odds = _answers(m, [_logits(3 + 1, 3 + 3)])
  assert preds == {"q": "there,  big"} and odds == {}  # spacing kept


def test_question_tokens_long_spans_and_backwards_spans_are_skipped():
  m = _one_question(OFFSETS, [(0, 5)])
  # A question token (position 1) has the highest start logit: not context.
  assert _answers(m, [_logits(4, 4, extra=[(1, "s", 9.0)])])[0]["q"] == (
      "there")
  # Best pair: "Hi" 5 + "world" 5.5 (5 tokens); with max_answer_length 2
  # the best pair of at most 2 tokens wins: "big" 4 + "world" 5.5.
  long = _logits(3, 6, extra=[(6, "s", 4.0), (7, "e", 5.5)])
  assert _answers(m, [long])[0]["q"] == "Hi there,  big world"
  assert _answers(m, [long], max_answer_length=2)[0]["q"] == "big world"
  # End before start is never an answer.
  back = _logits(6, 3, extra=[(3, "s", 1.0), (6, "e", 1.0)])
  assert _answers(m, [back])[0]["q"] in ("Hi", "big")


def test_best_over_windows_and_v2_null_odds():
  # Window 0 holds tokens 0-2, window 1 tokens 2-4 (token 2 in both).
  m = _one_question(OFFSETS, [(0, 3), (2, 3)])
  w0 = _logits(3, 4, high=2.0)  # "hi there": 4.0
  w1 = _logits(4, 5, high=3.0)  # tokens 3-4 of window 1: "big world": 6.0
  preds, _ = _answers(m, [w0, w1])
  assert preds["q"] == "big world"
  # v2: null score = min over windows of CLS start + end.
  w0n = (w0[0].copy(), w0[1].copy())
  w0n[0][0] = w0n[1][0] = 3.5  # 7.0 in window 0: the min
  w1n = (w1[0].copy(), w1[1].copy())
  w1n[0][0] = w1n[1][0] = 4.0  # 8.0 in window 1
  preds, odds = _answers(m, [w0n, w1n], version_2=True)
  assert odds["q"] == pytest.approx(7.0 - 6.0) and preds["q"] == ""
  preds, _ = _answers(m, [w0n, w1n], version_2=True, null_threshold=1.5)
  assert preds["q"] == "big world"


def test_nbest_list_is_run_squads_by_hand():
  """Candidates of both windows best first, a text twice (the overlap
  token ',' in both windows) kept once, n_best distinct texts, each with
  its logits and the softmax of start + end over the list."""
  import numpy as np
  # Window 0 holds tokens 0-2 (hi there ,), window 1 tokens 2-4 (, big world).
  m = _one_question(OFFSETS, [(0, 3), (2, 3)])
  w0 = _logits(3 + 2, 3 + 2, high=2.0)  # ',' 4.0 (others 0)
  w1 = _logits(3 + 0, 3 + 0, high=3.0, extra=[(3 + 2, "e", 1.0)])
  # Window 1: ',' 6.0; ', big world' 3 + 1 = 4.0; 'big'.. 'world' 0 ...
  entries, probs, pred, odds = _nbest(m, [w0, w1], n_best=3)
  assert pred == "," and odds == {}
  assert entries[0] == (",", 3.0, 3.0)  # window 1's; window 0's dropped
  assert entries[1] == (",  big world", 3.0, 1.0)
  assert len(entries) == 3 and len({t for t, _, _ in entries}) == 3
  assert entries[2][1] + entries[2][2] <= 4.0
  total = np.array([s + e for _, s, e in entries])
  np.testing.assert_allclose(probs, np.exp(total) / np.exp(total).sum())
  assert sum(probs) == pytest.approx(1.0)
  # max_answer_length 1 and n_best 1: one start and one end candidate each.
  entries, probs, pred, _ = _nbest(m, [w0, w1], n_best=1,
                                   max_answer_length=1)
  assert entries == [(",", 3.0, 3.0)] and probs == [1.0] and pred == ","


def test_nbest_v2_ranks_the_null_answer_and_always_holds_it():
  import numpy as np
  m = _one_question(OFFSETS, [(0, 5)])
  s, e = _logits(3 + 3, 3 + 3, high=2.0)  # 'big' 4.0
  s[0], e[0] = 2.5, 2.0  # null 4.5: ranked first, then 'big'
  entries, probs, pred, odds = _nbest(m, [(s, e)], version_2=True, n_best=2)
  assert entries[:2] == [("", 2.5, 2.0), ("big", 2.0, 2.0)]
  assert pred == "" and odds["q"] == pytest.approx(0.5)
  # n_best 1 with the span ahead: the null entry is appended after it.
  s[0], e[0] = 1.0, 1.0  # null 2.0
  entries, probs, pred, _ = _nbest(m, [(s, e)], version_2=True, n_best=1)
  assert entries == [("big", 2.0, 2.0), ("", 1.0, 1.0)] and pred == "big"
  np.testing.assert_allclose(probs, [np.exp(4) / (np.exp(4) + np.exp(2)),
                                     np.exp(2) / (np.exp(4) + np.exp(2))])


def test_nbest_without_a_valid_span_is_the_empty_prediction():
  m = _one_question(OFFSETS, [(0, 5)])
  s, e = _logits(3 + 4, 3 + 1, high=9.0)  # only backwards pairs
  entries, probs, pred, _ = _nbest(m, [(s, e)], n_best=1)
  assert (entries, probs, pred) == ([("", 0.0, 0.0)], [1.0], "")
