"""RoBERTa pretraining (bert_jax/objectives/roberta.py): the same losses on
1 and 8 devices (padded and packed rows), a stopped run resumes exactly
and exports as a RobertaForMaskedLM that gives our logits in PyTorch, and
the startup checks name the field."""

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import pretrained
from bert_jax.hf import mapping
from bert_jax.training import config_checks
from tests.helpers import family_checks


@pytest.mark.slow
@pytest.mark.parametrize("family", ["roberta", "roberta_packed"])
def test_one_vs_eight_devices_same_losses(tmp_path, family):
  family_checks.assert_meshes_agree(family, tmp_path)


@pytest.mark.slow
def test_resume_continues_exactly_and_the_run_exports(tmp_path):
  """Stop-and-rerun from the step-4 checkpoint of configs/roberta_base.py
  (shrunk; a byte-level BPE with RoBERTa's special tokens trained on the
  demo corpus), then `python -m bert_jax.to_hf`: RobertaForMaskedLM in
  PyTorch gives our logits, and fill_mask gives transformers' fill-mask
  pipeline's answer on the export."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bert_jax.downstream import mask_filling
  workdir = family_checks.assert_resume_is_exact(
      tmp_path, "roberta_base.py", "--config.model.num_hidden_layers=2")
  out = str(tmp_path / "hf")
  family_checks.export_workdir(workdir, out)
  source = pretrained.resolve(workdir)
  mc = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, mc)
  table = pretrained.resolve(out).table
  assert table.export_architecture == "RobertaForMaskedLM"
  ours = mapping.make_model(params, mc, table)
  r = np.random.RandomState(0)
  ids = np.where(np.arange(16)[None] < np.array([[16], [9]]),
                 r.randint(5, 300, (2, 16)), mc.pad_token_id)
  mask = (ids != mc.pad_token_id).astype(np.int32)
  want = np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask))["mlm_logits"])
  with torch.no_grad():
    got = transformers.RobertaForMaskedLM.from_pretrained(out).eval()(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)
    ).logits.numpy()
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-4)
  text = "The <mask> of the function."
  ours = mask_filling.fill_mask(out, text, top_k=3)
  theirs = transformers.pipeline("fill-mask", model=out)(text, top_k=3)
  assert [r["token"] for r in ours] == [r["token"] for r in theirs]
  np.testing.assert_allclose([r["score"] for r in ours],
                             [r["score"] for r in theirs], rtol=1e-4)


@pytest.mark.parametrize("family,title", [("roberta", "RoBERTa"),
                                          ("xlm-roberta", "XLM-R")])
def test_sentence_pairs_are_refused_naming_the_field(family, title):
  config = family_checks.family_config(family)
  config_checks.validate(config, 1, check_sources=False)
  config.data.update(nsp=True, objective="nsp")
  with pytest.raises(ValueError, match=(
      f"data.objective='nsp': {title} trains no sentence-pair head.*set "
      "data.nsp=False")):
    config_checks.validate(config, 1, check_sources=False)
