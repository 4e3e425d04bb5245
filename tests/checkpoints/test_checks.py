"""checkpoints/checks.py on small trees: a checkpoint of another model is
refused naming the parameter path, both shapes and the config fields that
differ; the checksums written at save find a changed bit, on the host and
on device alike."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.checkpoints import checks


def _tree(hidden=4, vocab=10, extra=False):
  tree = {"params": {"bert": {
      "embeddings": {"word_embeddings": np.zeros((vocab, hidden), np.float32)},
      "pooler": {"bias": np.zeros((hidden,), np.float32)}}},
      "step": np.int32(3)}
  if extra:
    tree["params"]["nsp_head"] = {"bias": np.zeros((2,), np.float32)}
  return tree


def test_matching_trees_pass():
  checks.check_compatible(_tree(), _tree(), source="step 3")


def test_mismatch_names_path_shapes_and_differing_config_fields():
  stored_config = dict(model=dict(hidden_size=4, vocab_size=10),
                       train=dict(optimizer="adamw", learning_rate=1e-3))
  current = ml_collections.ConfigDict(dict(
      model=dict(hidden_size=8, vocab_size=10),
      train=dict(optimizer="lamb", learning_rate=5e-4)))
  with pytest.raises(checks.CheckpointMismatchError) as e:
    checks.check_compatible(_tree(hidden=4, extra=True), _tree(hidden=8),
                            source="step 3 in /w",
                            stored_config=stored_config,
                            current_config=current, hint="Use another one.")
  assert str(e.value) == (
      "Checkpoint step 3 in /w does not match this config: "
      "params/bert/embeddings/word_embeddings has shape (10, 4) in the "
      "checkpoint but (10, 8) in this config (and 2 more: "
      "params/bert/pooler/bias has shape (4,) in the checkpoint but (8,) in "
      "this config; params/nsp_head/bias (shape (2,)) is in the checkpoint "
      "but not in this config's model). Config fields that differ: "
      "model.hidden_size: 4 in the checkpoint, 8 in this config; "
      "train.optimizer: 'adamw' in the checkpoint, 'lamb' in this config. "
      "Use another one.")


def test_a_missing_parameter_is_named():
  with pytest.raises(checks.CheckpointMismatchError, match=(
      r"params/nsp_head/bias \(shape \(2,\)\) is missing from the "
      r"checkpoint\.$")):
    checks.check_compatible(_tree(), _tree(extra=True), source="step 3")


def _state():
  r = np.random.default_rng(0)
  return {"w": r.normal(size=(5, 7)).astype(np.float32),
          "half": jnp.asarray(r.normal(size=(3, 4)), jnp.bfloat16),
          "ids": r.integers(0, 9, (6,)).astype(np.int32),
          "mask": r.random((2, 3)) > 0.5}


def test_checksums_are_the_same_on_host_and_device():
  state = _state()
  assert (checks.state_digest(state, on_device=True) ==
          checks.state_digest(state, on_device=False))


@pytest.mark.parametrize("leaf, index", [("w", (4, 6)), ("ids", (0,)),
                                         ("mask", (1, 2))])
def test_a_changed_element_is_found_and_named(leaf, index):
  state = _state()
  record = checks.digest_record(state)
  checks.check_digest(state, record, "Checkpoint step 3")
  damaged = dict(state)
  damaged[leaf] = state[leaf].copy()
  damaged[leaf][index] = (not damaged[leaf][index] if leaf == "mask"
                          else damaged[leaf][index] + 1)
  with pytest.raises(checks.CheckpointDamagedError) as e:
    checks.check_digest(damaged, record, "Checkpoint step 3")
  assert str(e.value) == (
      f"Checkpoint step 3 is damaged: {leaf} differs from the checksums "
      "written at save (overwritten bytes in its files); use another step.")


def test_swapped_elements_change_the_weighted_sum():
  state = _state()
  record = checks.digest_record(state)
  swapped = dict(state, w=state["w"][::-1].copy())  # Same plain sum.
  assert checks.digest_mismatches(swapped, record) == ["w"]
