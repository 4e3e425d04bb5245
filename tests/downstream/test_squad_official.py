"""Our SQuAD v2.0 scores against the official ``evaluate-v2.0.py``.

``_Official`` below is the official script's logic written out function by
function (normalize_answer, get_tokens, compute_exact, compute_f1,
get_raw_scores, apply_no_ans_threshold, make_eval_dict, merge_eval,
find_best_thresh, find_all_best_thresh and its main's order), reading the
same dataset layout (data -> paragraphs -> qas -> answers) and returning the
dict it prints. Random predictions, gold sets (with answers that normalise
to "", such as "the"), null odds with ties, and thresholds are scored by
both; every number must agree (ours are fractions, the script's x100).
"""

import collections
import random
import re
import string

import pytest

from bert_jax.tasks import squad_metrics


class _Official:
  """evaluate-v2.0.py, one method per function of the script."""

  @staticmethod
  def make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
      for p in article["paragraphs"]:
        for qa in p["qas"]:
          qid_to_has_ans[qa["id"]] = bool(qa["answers"])
    return qid_to_has_ans

  @staticmethod
  def normalize_answer(s):
    def remove_articles(text):
      regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
      return re.sub(regex, " ", text)

    def white_space_fix(text):
      return " ".join(text.split())

    def remove_punc(text):
      exclude = set(string.punctuation)
      return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
      return text.lower()
    return white_space_fix(remove_articles(remove_punc(lower(s))))

  @classmethod
  def get_tokens(cls, s):
    if not s:
      return []
    return cls.normalize_answer(s).split()

  @classmethod
  def compute_exact(cls, a_gold, a_pred):
    return int(cls.normalize_answer(a_gold) == cls.normalize_answer(a_pred))

  @classmethod
  def compute_f1(cls, a_gold, a_pred):
    gold_toks = cls.get_tokens(a_gold)
    pred_toks = cls.get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
      # If either is no-answer, then F1 is 1 if they agree, 0 otherwise.
      return int(gold_toks == pred_toks)
    if num_same == 0:
      return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1

  @classmethod
  def get_raw_scores(cls, dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
      for p in article["paragraphs"]:
        for qa in p["qas"]:
          qid = qa["id"]
          gold_answers = [a["text"] for a in qa["answers"]
                          if cls.normalize_answer(a["text"])]
          if not gold_answers:
            # For unanswerable questions, only correct answer is empty string
            gold_answers = [""]
          if qid not in preds:
            continue
          a_pred = preds[qid]
          # Take max over all gold answers
          exact_scores[qid] = max(cls.compute_exact(a, a_pred)
                                  for a in gold_answers)
          f1_scores[qid] = max(cls.compute_f1(a, a_pred)
                               for a in gold_answers)
    return exact_scores, f1_scores

  @staticmethod
  def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans,
                             na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
      pred_na = na_probs[qid] > na_prob_thresh
      if pred_na:
        new_scores[qid] = float(not qid_to_has_ans[qid])
      else:
        new_scores[qid] = s
    return new_scores

  @staticmethod
  def make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
      total = len(exact_scores)
      return collections.OrderedDict([
          ("exact", 100.0 * sum(exact_scores.values()) / total),
          ("f1", 100.0 * sum(f1_scores.values()) / total),
          ("total", total),
      ])
    else:
      total = len(qid_list)
      return collections.OrderedDict([
          ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
          ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
          ("total", total),
      ])

  @staticmethod
  def merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
      main_eval["%s_%s" % (prefix, k)] = new_eval[k]

  @staticmethod
  def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
      if qid not in scores:
        continue
      if qid_to_has_ans[qid]:
        diff = scores[qid]
      else:
        if preds[qid]:
          diff = -1
        else:
          diff = 0
      cur_score += diff
      if cur_score > best_score:
        best_score = cur_score
        best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh

  @classmethod
  def find_all_best_thresh(cls, main_eval, preds, exact_raw, f1_raw,
                           na_probs, qid_to_has_ans):
    best_exact, exact_thresh = cls.find_best_thresh(preds, exact_raw,
                                                    na_probs, qid_to_has_ans)
    best_f1, f1_thresh = cls.find_best_thresh(preds, f1_raw, na_probs,
                                              qid_to_has_ans)
    main_eval["best_exact"] = best_exact
    main_eval["best_exact_thresh"] = exact_thresh
    main_eval["best_f1"] = best_f1
    main_eval["best_f1_thresh"] = f1_thresh

  @classmethod
  def main(cls, dataset, preds, na_prob_file=None, na_prob_thresh=1.0):
    """The script's main() after reading its files: the printed dict."""
    if na_prob_file is not None:
      na_probs = na_prob_file
    else:
      na_probs = {k: 0.0 for k in preds}
    qid_to_has_ans = cls.make_qid_to_has_ans(dataset)
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = cls.get_raw_scores(dataset, preds)
    exact_thresh = cls.apply_no_ans_threshold(exact_raw, na_probs,
                                              qid_to_has_ans, na_prob_thresh)
    f1_thresh = cls.apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans,
                                           na_prob_thresh)
    out_eval = cls.make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
      has_ans_eval = cls.make_eval_dict(exact_thresh, f1_thresh,
                                        qid_list=has_ans_qids)
      cls.merge_eval(out_eval, has_ans_eval, "HasAns")
    if no_ans_qids:
      no_ans_eval = cls.make_eval_dict(exact_thresh, f1_thresh,
                                       qid_list=no_ans_qids)
      cls.merge_eval(out_eval, no_ans_eval, "NoAns")
    if na_prob_file is not None:
      cls.find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs,
                               qid_to_has_ans)
    return dict(out_eval)


# Answer texts: words, answers that normalise to "" (articles, punctuation,
# blanks), case and punctuation variants, repeated tokens.
_TEXTS = ("Paris", "paris!", "the Paris", "in Paris", "Paris Paris", "1,000",
          "1000", "Denver Broncos", "broncos", "the", "The", "a", "an .",
          "!", " ", "", "Café—Noir", "café—noir", "the cat", "a cat sat")


def _ours_as_printed(gold, preds, null_odds, thresh) -> dict:
  """Our scores in the script's units and keys."""
  scores, extras = squad_metrics.evaluate(gold, preds, True, null_odds,
                                          na_prob_thresh=thresh)
  out = {k: 100.0 * v for k, v in scores.items()}
  out["total"] = extras["total"]
  for split in ("HasAns", "NoAns"):  # The script prints a split it has.
    if f"{split}_exact" in scores:
      out[f"{split}_total"] = extras[f"{split}_total"]
  for key in ("best_exact_thresh", "best_f1_thresh"):
    if key in extras:
      out[key] = extras[key]
  return out


def _dataset(gold) -> list:
  """gold {id: [texts]} in the SQuAD JSON layout, two questions a
  paragraph."""
  ids = list(gold)
  paragraphs = [dict(context="...", qas=[
      dict(id=q, question="?", answers=[dict(text=t, answer_start=0)
                                        for t in gold[q]])
      for q in ids[i:i + 2]]) for i in range(0, len(ids), 2)]
  return [dict(title="t", paragraphs=paragraphs)]


def _assert_same(official: dict, ours: dict, context):
  assert sorted(official) == sorted(ours), context
  for key, value in official.items():
    assert ours[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (
        key, context)


def test_official_order_on_an_empty_normalising_gold_whose_null_won():
  # Answerable (gold "the" normalises to ""), null answer predicted (odds 2
  # over the threshold 0): the official script scores it 0 (predicted
  # unanswerable, but it has answers), not 1 for "" == "".
  gold, preds, odds = {"q": ["the"]}, {"q": ""}, {"q": 2.0}
  official = _Official.main(_dataset(gold), preds, odds, 0.0)
  assert official["exact"] == 0.0 and official["f1"] == 0.0
  _assert_same(official, _ours_as_printed(gold, preds, odds, 0.0), "the")


@pytest.mark.parametrize("seed", range(40))
def test_random_cases_equal_the_official_script(seed):
  rng = random.Random(seed)
  n = rng.randint(1, 25)
  gold, preds, odds = {}, {}, {}
  for i in range(n):
    q = f"q{i}"
    gold[q] = ([] if rng.random() < 0.35 else
               [rng.choice(_TEXTS) for _ in range(rng.randint(1, 3))])
    preds[q] = "" if rng.random() < 0.35 else rng.choice(_TEXTS)
    # Few distinct values: ties in the official sort and at the threshold.
    odds[q] = float(rng.choice((-4, -1.5, -1, 0, 0, 0.5, 1, 2, 7)))
  thresh = float(rng.choice((-2, -1, 0, 0.5, 1, 1.5, 3)))
  for null_odds in (odds, None):
    official = _Official.main(_dataset(gold), preds, null_odds, thresh)
    _assert_same(official, _ours_as_printed(gold, preds, null_odds, thresh),
                 (seed, gold, preds, null_odds, thresh))
