"""Checkpoints: what is saved, keep policy, corruption, wrong config, meshes.

Unit level: states are the real model/optimizer trees (from
`steps_lib.Programs(...).abstract_state`, no compile) filled with random host
values, so every test is about the checkpoint, not about training.
"""

import asyncio
import gc
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.checkpoints import checks as checkpoint_checks
from bert_jax.checkpoints import manager
from bert_jax.checkpoints import orbax_reads
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.training import preemption
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from bert_jax.training import trainer as trainer_lib
from tests.helpers import REPO
from tests.helpers import child_env
from tests.helpers import free_port
from tests.helpers import tiny_config


# ------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------
def small_config(hidden=64, heads=4):
  config = tiny_config()
  config.model.update(vocab_size=128, hidden_size=hidden,
                      num_hidden_layers=2, num_attention_heads=heads,
                      intermediate_size=2 * hidden)
  config.checkpoint.update(async_save=True, max_to_keep=3)
  return config


def random_state(abstract, seed=0):
  """Host random values for every leaf of `abstract`, placed on its sharding."""
  rng = np.random.default_rng(seed)

  def fill(a):
    if jnp.issubdtype(a.dtype, jnp.floating):
      x = rng.standard_normal(a.shape).astype(a.dtype)
    else:
      x = rng.integers(0, 1000, a.shape).astype(a.dtype)
    return jax.make_array_from_callback(a.shape, a.sharding, lambda i: x[i])

  return jax.tree.map(fill, abstract)


def host(tree):
  return jax.tree.map(np.array, jax.device_get(tree))  # Writable copies.


def assert_trees_equal(a, b):
  fa, fb = checkpoint_checks._flat(host(a)), checkpoint_checks._flat(host(b))
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


class CountingIterator:
  """Stands in for the tf.data iterator: its state is the batch count."""

  def __init__(self):
    self.position = 0

  def __next__(self):
    self.position += 1

  def save(self, directory):
    with open(os.path.join(directory, "position"), "w") as f:
      f.write(str(self.position))

  def restore(self, directory):
    with open(os.path.join(directory, "position")) as f:
      self.position = int(f.read())


@pytest.fixture(scope="module")
def programs():
  config = small_config()
  return config, steps_lib.Programs(config, sharding.make_mesh(config.mesh))


def save_steps(workdir, config, abstract, steps, iterator=None):
  """Save random states at `steps`; returns {step: host copy}."""
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  saved = {}
  for s in steps:
    state = random_state(abstract, seed=s)
    saved[s] = host(state)
    if iterator is not None:
      iterator.position = 100 + s
    ckpt.save(s, state, iterator, meta=dict(config=config.to_dict()))
  ckpt.wait()
  ckpt.close()
  return saved


# ------------------------------------------------------------------------------
# 1. What a checkpoint holds, async; keep policy.
# ------------------------------------------------------------------------------
def small_abstract(mesh):
  rep = sharding.replicated(mesh)
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)
  return dict(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
              rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
              params={"w": f32(256, 256), "b": f32(256)},
              opt_state={"mu": f32(256, 256)})


def test_async_save_holds_state_and_iterator_of_the_save_step(tmp_path):
  """The loop advances the iterator and overwrites (donates) the state right
  after save() returns; the checkpoint must still hold the save step's."""
  config = small_config()
  config.checkpoint.async_save = True
  abstract = small_abstract(sharding.make_mesh(config.mesh))
  update = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s),
                   donate_argnums=0)
  state = random_state(abstract)
  expected = host(state)
  it = CountingIterator()
  it.position = 7
  ckpt = manager.Checkpointer(str(tmp_path), config.checkpoint)
  ckpt.save(7, state, it, meta={"metrics": {"loss": 1.5}})
  next(it)  # The loop goes on at once...
  for _ in range(3):
    state = update(state)  # ...donating the saved buffers.
  jax.block_until_ready(state)
  ckpt.wait()
  restored_it = CountingIterator()
  restored = ckpt.restore(7, abstract, restored_it)
  assert restored_it.position == 7
  assert_trees_equal(restored, expected)
  assert checkpoint_reading.read_meta(str(tmp_path), 7)["metrics"]["loss"] == 1.5
  ckpt.close()


def test_keeps_last_n_plus_every_keep_period_step(tmp_path):
  config = small_config()
  config.checkpoint.update(max_to_keep=2, keep_period=4, async_save=False)
  abstract = small_abstract(sharding.make_mesh(config.mesh))
  save_steps(tmp_path, config, abstract, range(1, 10))
  ckpt = manager.Checkpointer(str(tmp_path), config.checkpoint)
  assert ckpt.all_steps() == [4, 8, 9]
  ckpt.close()


# ------------------------------------------------------------------------------
# 3. Restore onto another mesh (8 devices -> 2 -> 1) and numpy without a mesh.
# ------------------------------------------------------------------------------
_MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from tests.checkpoints.test_manager import small_config, random_state, host
    from bert_jax.checkpoints import checks as checkpoint_checks
    from bert_jax.checkpoints import manager
    from bert_jax.checkpoints import reading as checkpoint_reading
    from bert_jax.training import sharding
    from bert_jax.training import steps as steps_lib
    from bert_jax.training import trainer as trainer_lib
    mode, root = sys.argv[1], sys.argv[2]
    layouts = dict(dp=dict(data=-1, fsdp=1, tensor=1),
                   fsdp=dict(data=1, fsdp=-1, tensor=1),
                   tp=dict(data=2, fsdp=1, tensor=4))
    def programs(layout, devices):
      config = small_config()
      config.mesh.update(layout)
      mesh = sharding.make_mesh(config.mesh, devices)
      return config, steps_lib.Programs(config, mesh)
    out = {}
    for name, layout in layouts.items():
      workdir = f"{root}/{name}"
      if mode == "save":
        assert jax.device_count() == 8
        config, p = programs(layout, jax.devices())
        state = random_state(p.abstract_state, seed=len(name))
        # Checksums: the jitted on-device sums equal the host's over shards
        # (restore below recomputes them on 2 devices and on 1).
        assert (checkpoint_checks.state_digest(state, on_device=True) ==
                checkpoint_checks.state_digest(state, on_device=False)), name
        flat = checkpoint_checks._flat(host(state))
        np.savez(f"{root}/{name}.npz", **flat)
        ckpt = manager.Checkpointer(workdir, config.checkpoint)
        ckpt.save(3, state, meta=dict(config=config.to_dict()))
        ckpt.wait(); ckpt.close()
        out[name] = sorted({str(a.sharding.shard_shape(a.shape)) for a in
                            jax.tree.leaves(state["params"])})
      else:
        assert jax.device_count() == 2
        ref = np.load(f"{root}/{name}.npz")
        for devices, target in ((jax.devices(), dict(data=1, fsdp=-1,
                                                       tensor=1)),
                                (jax.devices()[:1], dict(data=-1))):
          config, p = programs(dict(dict(data=1, fsdp=1, tensor=1), **target),
                               devices)
          ckpt = manager.Checkpointer(workdir, config.checkpoint)
          state = ckpt.restore(3, p.abstract_state)
          ckpt.close()
          flat = checkpoint_checks._flat(host(state))
          assert sorted(flat) == sorted(ref.files), name
          bad = [k for k in ref.files if not np.array_equal(ref[k], flat[k])]
          assert not bad, (name, bad[:3])
          leaf = state["params"]["bert"]["embeddings"]["word_embeddings"]
          out.setdefault(name, []).append(len(leaf.sharding.device_set))
    print("RESULT", json.dumps(out))
""")


def _run_devices(n, *args):
  env = child_env(n)
  r = subprocess.run(
      [sys.executable, "-c", _MESH_SCRIPT, *args],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  line = [l for l in r.stdout.splitlines() if l.startswith("RESULT")][-1]
  return json.loads(line[len("RESULT"):])


@pytest.mark.slow
def test_restore_8_devices_onto_2_and_1_and_numpy(tmp_path):
  saved = _run_devices(8, "save", str(tmp_path))
  # The three layouts really were different shardings of the params.
  assert len({json.dumps(v) for v in saved.values()}) == 3
  restored = _run_devices(2, "restore", str(tmp_path))
  assert restored == {"dp": [2, 1], "fsdp": [2, 1], "tp": [2, 1]}
  # And the params alone, as numpy, with no mesh (export/analysis).
  for name in ("dp", "fsdp", "tp"):
    params, config, step = checkpoint_reading.load_params(str(tmp_path / name))
    ref = np.load(tmp_path / f"{name}.npz")
    assert step == 3 and config.model.hidden_size == 64
    assert 0 in params["bert"]["layers"]  # int layer keys, as in the model
    for k, v in checkpoint_checks._flat({"params": params}).items():
      assert v.dtype == np.float32
      np.testing.assert_array_equal(v, ref[k], err_msg=k)


# ------------------------------------------------------------------------------
# 4. Wrong checkpoint; partial restore only on request.
# ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, programs):
  """A workdir with checkpoints at steps 2 and 4 of the small config."""
  config, p = programs
  workdir = tmp_path_factory.mktemp("saved_run")
  saved = save_steps(workdir, config, p.abstract_state, (2, 4),
                     CountingIterator())
  return workdir, saved


def test_wrong_model_config_names_path_and_both_shapes(saved_run, tmp_path):
  workdir, _ = saved_run
  other = small_config(hidden=32, heads=2)
  p = steps_lib.Programs(other, sharding.make_mesh(other.mesh))
  ckpt = manager.Checkpointer(str(workdir), other.checkpoint)
  with pytest.raises(ValueError) as e:
    ckpt.restore_latest(p.abstract_state, config=other)
  msg = str(e.value)
  assert "params/bert/" in msg.split(":")[1], msg
  assert "(64,)" in msg and "(32,)" in msg, msg
  assert "model.hidden_size: 64 in the checkpoint, 32 in this config" in msg
  # A mismatch is not corruption: nothing was moved away.
  assert ckpt.all_steps() == [2, 4]
  ckpt.close()
  # Params-only restore checks shapes the same way.
  with pytest.raises(ValueError, match=r"params/bert/.*\(64.*\(32"):
    checkpoint_reading.restore_params(str(workdir), p.abstract_state["params"])


def test_params_only_restore_happens_only_when_asked(saved_run, tmp_path,
                                                     programs):
  workdir, saved = saved_run
  config, p = programs
  # A fresh workdir restores nothing by itself...
  fresh = manager.Checkpointer(str(tmp_path / "new"), config.checkpoint)
  assert fresh.restore_latest(p.abstract_state) == (None, None)
  fresh.close()
  # ...and train.init_from takes params (only) of another run's latest step.
  trainer = object.__new__(trainer_lib.Trainer)
  trainer.config = config.copy_and_resolve_references()
  trainer.abstract_state = p.abstract_state
  params = trainer._init_params(str(workdir))
  assert_trees_equal(params, saved[4]["params"])
  leaf = params["bert"]["embeddings"]["word_embeddings"]
  assert leaf.sharding == p.state_sharding["params"]["bert"]["embeddings"][
      "word_embeddings"]
  # A step directory works too.
  params2, step = checkpoint_reading.restore_params(
      str(workdir / "checkpoints" / "2"), p.abstract_state["params"])
  assert step == 2
  assert_trees_equal(params2, saved[2]["params"])


# ------------------------------------------------------------------------------
# 5. Crash during save: incomplete or corrupt steps.
# ------------------------------------------------------------------------------
def _copy_run(saved_run, tmp_path):
  workdir, saved = saved_run
  dst = tmp_path / "run"
  shutil.copytree(workdir, dst)
  return dst, saved


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate_array_file", "empty_metadata",
                                    "missing_data_file"])
def test_damaged_latest_step_falls_back_to_previous_with_warning(
    saved_run, tmp_path, programs, damage, caplog, monkeypatch):
  config, p = programs
  workdir, saved = _copy_run(saved_run, tmp_path)
  step_dir = workdir / "checkpoints" / "4"
  if damage == "truncate_array_file":
    files = [f for f in glob.glob(f"{step_dir}/state/**", recursive=True)
             if os.path.isfile(f)]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
      f.truncate(os.path.getsize(biggest) // 2)
  elif damage == "empty_metadata":
    open(step_dir / "state" / "_METADATA", "w").close()
  else:
    os.remove(step_dir / "data" / "position")
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  it = CountingIterator()
  printed = []  # What would reach the interpreter's hook (which prints).
  monkeypatch.setattr(sys, "unraisablehook", printed.append)
  with caplog.at_level(logging.WARNING):
    state, step = ckpt.restore_latest(p.abstract_state, it)
    gc.collect()  # The failed read left nothing to print when collected.
  assert not printed, printed
  assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
  assert step == 2 and it.position == 102
  assert_trees_equal(state, saved[2])
  assert "Checkpoint step 4" in caplog.text
  assert "newest good checkpoint" in caplog.text
  # The bad step is set aside, not deleted, and never listed again...
  assert ckpt.all_steps() == [2]
  assert len(os.listdir(workdir / manager.CORRUPT_DIR)) == 1
  # ...and does not block saving that step again.
  ckpt.save(4, state, it)
  ckpt.wait()
  assert ckpt.all_steps() == [2, 4]
  ckpt.close()


async def _fail_after(turns: int, what: str):
  for _ in range(turns):
    await asyncio.sleep(0)
  raise ValueError(what)


async def _still_reading():
  """Like Orbax's _read_array_index_and_device_put: any error, the
  GeneratorExit of being closed included, re-raised as another exception."""
  try:
    await asyncio.sleep(60)
  except BaseException as e:
    raise Exception("Encountered error while reading array index") from e


async def _tensorstore_read(turns: int):
  """Like awaiting a TensorStore read: a future its thread fails later."""
  loop = asyncio.get_running_loop()
  future = loop.create_future()

  def fail(turns_left):
    if turns_left:
      loop.call_soon(fail, turns_left - 1)
    elif not future.done():
      future.set_exception(ValueError("OUT_OF_RANGE"))

  loop.call_soon(fail, turns)
  await future


async def _restore_arrays(turns: int):
  """Like Orbax's restore: a gather of arrays, each a gather of its reads.
  The first read fails at once, a second array's and a TensorStore read
  `turns` loop turns later, a third read is still running."""
  async def array():
    await asyncio.gather(_fail_after(turns, "second"))
  await asyncio.gather(_fail_after(0, "first"), array(),
                       _tensorstore_read(turns), _still_reading())


@pytest.mark.parametrize("turns", range(4))
def test_failed_orbax_read_leaves_nothing_to_print(turns, monkeypatch,
                                                   caplog):
  """Orbax's run_sync closes its loop as soon as the first read fails. Left
  so, the reads still running or failing just then are finalized later by
  the garbage collector, each printing a traceback: 'Exception ignored in:
  <coroutine ...>', or 'Task / _GatheringFuture / Future exception was never
  retrieved'. Which, if any, depends on how far the other reads had got
  (CPU load); here `turns` sets it. Under `orbax_reads` every task finishes
  inside the call and nothing is printed."""
  from orbax.checkpoint._src import asyncio_utils
  printed = []  # What would reach the interpreter's hook (which prints).
  monkeypatch.setattr(sys, "unraisablehook", printed.append)

  def leftovers(run):
    printed.clear()
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
      with pytest.raises(ValueError, match="first"):
        run()
      gc.collect()
    return printed + [r.getMessage().splitlines()[0] for r in caplog.records]

  # Orbax alone: this test's scenario is the one that printed.
  assert leftovers(lambda: asyncio_utils.run_sync(_restore_arrays(turns))), (
      "Orbax's run_sync leaves no task behind here; "
      "checkpoints/orbax_reads.py may be unnecessary.")
  # As checkpointing runs Orbax's reads: every task finished in the call.
  def ours():
    with orbax_reads.orbax_reads():
      asyncio_utils.run_sync(_restore_arrays(turns))
  assert leftovers(ours) == []
  assert not isinstance(asyncio.get_event_loop_policy(),
                        orbax_reads._LoopsFinishTheirTasks)


def _biggest_state_file(step_dir):
  files = [f for f in glob.glob(f"{step_dir}/state/**", recursive=True)
           if os.path.isfile(f)]
  return max(files, key=os.path.getsize)


@pytest.mark.slow
@pytest.mark.parametrize("where", [0.1, 0.3, 0.5, 0.7])
def test_overwritten_bytes_are_found_at_restore_and_set_aside(
    saved_run, tmp_path, programs, where, caplog):
  """16 bytes of the biggest state file overwritten (a bad disk, a stray
  write). Where they land decides what restore sees (the file holds array
  chunks and OCDBT index nodes, laid out in the order the async writes
  finished): in a chunk the arrays still decode, to other numbers, so only
  the checksums written at save find it; in a node TensorStore cannot read
  the step. Either way step 4 is damaged: set aside like a truncated one and
  step 2 restored; export refuses the step when the damage is in what it
  reads."""
  config, p = programs
  workdir, saved = _copy_run(saved_run, tmp_path)
  biggest = _biggest_state_file(workdir / "checkpoints" / "4")
  with open(biggest, "r+b") as f:
    f.seek(int(os.path.getsize(biggest) * where))
    f.write(np.random.default_rng(0).bytes(16))
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  with pytest.raises(checkpoint_checks.CheckpointDamagedError,
                     match=r"^Checkpoint step 4 in .* is damaged: ((\S+) "
                     r"differs from the checksums written at save|its files "
                     r"cannot be read \(ValueError: .*OCDBT)") as e:
    ckpt.restore(4, p.abstract_state, CountingIterator())
  damaged = str(e.value).split(" is damaged: ")[1].split()[0]
  if damaged == "its":  # An index node: export reads what it can reach.
    try:
      params, _, step = checkpoint_reading.load_params(str(workdir))
    except checkpoint_checks.CheckpointDamagedError as export_error:
      assert "is damaged: its files cannot be read" in str(export_error)
    else:  # The node indexed optimizer state only: the params are whole.
      assert step == 4
      assert_trees_equal(params, checkpoint_reading._int_keys(
          saved[4]["params"]))
  elif damaged.startswith("params/"):
    with pytest.raises(ValueError, match=f"is damaged: {damaged} differs"):
      checkpoint_reading.load_params(str(workdir))
  else:  # The optimizer state: the params export as they were saved.
    params, _, step = checkpoint_reading.load_params(str(workdir))
    assert step == 4
    assert_trees_equal(params, checkpoint_reading._int_keys(
        saved[4]["params"]))
  it = CountingIterator()
  with caplog.at_level(logging.WARNING):
    state, step = ckpt.restore_latest(p.abstract_state, it)
  assert step == 2 and it.position == 102
  assert_trees_equal(state, saved[2])
  assert "Checkpoint step 4" in caplog.text and "is damaged" in caplog.text
  assert ckpt.all_steps() == [2]
  assert len(os.listdir(workdir / manager.CORRUPT_DIR)) == 1
  ckpt.close()
  params, _, step = checkpoint_reading.load_params(str(workdir))
  assert step == 2


def test_an_unreadable_index_is_damage_and_export_says_so(
    saved_run, tmp_path, programs):
  """Overwritten bytes in the OCDBT manifest (the index of every array):
  TensorStore cannot read the step. Restore and export name the step as
  damaged with TensorStore's reason, one line, not a stack of Orbax
  wrappers; resume sets the step aside."""
  config, p = programs
  workdir, saved = _copy_run(saved_run, tmp_path)
  manifest = workdir / "checkpoints" / "4" / "state" / "manifest.ocdbt"
  with open(manifest, "r+b") as f:
    f.seek(os.path.getsize(manifest) // 2)
    f.write(np.random.default_rng(0).bytes(16))
  unreadable = (r"^Checkpoint step 4 in .*checkpoints is damaged: its files "
                r"cannot be read \(ValueError: DATA_LOSS: .*OCDBT")
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  with pytest.raises(checkpoint_checks.CheckpointDamagedError,
                     match=unreadable):
    ckpt.restore(4, p.abstract_state)
  with pytest.raises(checkpoint_checks.CheckpointDamagedError,
                     match=unreadable):
    checkpoint_reading.load_params(str(workdir))
  state, step = ckpt.restore_latest(p.abstract_state)
  assert step == 2
  assert_trees_equal(state, saved[2])
  ckpt.close()


def test_a_storage_fault_is_not_damage(tmp_path):
  """A read that fails because the storage refused it (not because bytes do
  not decode) is raised as it is: the step may be whole, so it is never
  set aside as damaged."""
  refused = ValueError('PERMISSION_DENIED: Error reading "x" from bucket')
  with pytest.raises(RuntimeError, match="^Orbax's wrapper$") as e:
    with checkpoint_reading.damage_on_read(str(tmp_path / "4")):
      raise RuntimeError("Orbax's wrapper") from refused
  assert e.value.__cause__ is refused
  damaged = ValueError('DATA_LOSS: Error reading "a/0.0" in OCDBT database')
  with pytest.raises(checkpoint_checks.CheckpointDamagedError,
                     match=r"^Checkpoint step 4 in .* is damaged: its files "
                     r"cannot be read \(ValueError: DATA_LOSS: Error reading"):
    with checkpoint_reading.damage_on_read(str(tmp_path / "4")):
      raise RuntimeError("Orbax's wrapper") from damaged


def test_truncated_meta_is_set_aside_and_export_says_so(saved_run, tmp_path,
                                                         programs, caplog):
  """A truncated meta (config, metrics, checksums) is damage: restore sets
  the step aside with a warning and the exporters refuse it as damaged (not
  as a step that "stores no model config")."""
  config, p = programs
  workdir, saved = _copy_run(saved_run, tmp_path)
  meta = workdir / "checkpoints" / "4" / "meta" / "metadata"
  meta.write_bytes(meta.read_bytes()[:50])
  with pytest.raises(ValueError, match=r"^Checkpoint step 4 in .* is damaged:"
                     r" its meta .* is unreadable"):
    checkpoint_reading.load_params(str(workdir))
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  with caplog.at_level(logging.WARNING):
    state, step = ckpt.restore_latest(p.abstract_state)
  assert step == 2
  assert_trees_equal(state, saved[2])
  assert "Checkpoint step 4" in caplog.text and "meta" in caplog.text
  assert ckpt.all_steps() == [2]
  ckpt.close()


def test_interrupted_save_is_never_latest_and_never_blocks(saved_run,
                                                           tmp_path, programs):
  """What a kill during an async save leaves: an uncommitted tmp directory."""
  config, p = programs
  workdir, saved = _copy_run(saved_run, tmp_path)
  ckpts = workdir / "checkpoints"
  partial = ckpts / "6.orbax-checkpoint-tmp-1700000000000"
  shutil.copytree(ckpts / "4", partial)
  os.remove(partial / "commit_success.txt")
  for f in glob.glob(f"{partial}/state/ocdbt.process_0/d/*")[:1]:
    os.remove(f)
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  assert ckpt.latest_step() == 4
  state, step = ckpt.restore_latest(p.abstract_state)
  assert step == 4
  assert_trees_equal(state, saved[4])
  assert not partial.exists()  # Cleaned up when the next run starts.
  ckpt.save(6, state)
  ckpt.wait()
  assert ckpt.all_steps() == [2, 4, 6]
  ckpt.close()


# ------------------------------------------------------------------------------
# 7. Non-finite values.
# ------------------------------------------------------------------------------
def test_save_refuses_nonfinite_params(tmp_path, programs):
  config, p = programs
  state = host(random_state(p.abstract_state))
  state["params"]["bert"]["layers"][1]["feed_forward"]["output"]["bias"][3] = (
      np.nan)
  ckpt = manager.Checkpointer(str(tmp_path), config.checkpoint)
  with pytest.raises(FloatingPointError,
                     match="params/bert/layers/1/feed_forward/output/bias"):
    ckpt.save(5, state)
  ckpt.wait()
  assert ckpt.all_steps() == []
  assert not os.path.exists(tmp_path / "checkpoints" / "5")
  ckpt.close()


def test_nonfinite_policies():
  flags = {s: jnp.asarray(s not in (3, 6, 7)) for s in range(1, 10)}
  # stop: at the first non-finite step, naming it.
  stop = preemption.NonFiniteMonitor("stop", 5)
  with pytest.raises(FloatingPointError, match="at step 3 "):
    for s in range(1, 10):
      stop.observe(s, flags[s])
    stop.flush()
  # skip: drops and counts; stops after max_in_a_row consecutive ones.
  skip = preemption.NonFiniteMonitor("skip", 2)
  for s in range(1, 7):
    skip.observe(s, flags[s])
  skip.flush()
  assert (skip.total, skip.in_a_row, skip.skipped_steps) == (2, 1, [3, 6])
  with pytest.raises(FloatingPointError, match=r"2 non-finite steps in a row "
                     r"\(steps 6-7"):
    skip.observe(7, flags[7])
    skip.flush()
  # A resumed run continues the count stored in the checkpoint.
  resumed = preemption.NonFiniteMonitor("skip", 2, in_a_row=1, total=4)
  with pytest.raises(FloatingPointError):
    resumed.observe(8, jnp.asarray(False))
    resumed.flush()
  with pytest.raises(ValueError, match="nonfinite_policy"):
    preemption.NonFiniteMonitor("ignore", 2)


# ------------------------------------------------------------------------------
# 8. Multi-process: a workdir other processes cannot reach.
# ------------------------------------------------------------------------------
_SHARED_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    port, pid, workdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid)
    from bert_jax.training import preemption
    from bert_jax.checkpoints import workdir_lock
    try:
      workdir_lock.check_workdir_shared(workdir)
      print("SHARED")
    except ValueError as e:
      print("REFUSED", e)
      sys.exit(0)
    # Preemption with several processes: SIGTERM reaches process 1 only; the
    # JAX sync point makes every process stop at the same step.
    import os, signal, time
    watcher = preemption.PreemptionWatcher()
    for step in range(1, 3000):
      if pid == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGTERM)
      if watcher.reached(step):
        print("SYNC", step)
        break
      time.sleep(0.005)
""")


def _start_pair(workdirs):
  env = child_env()
  env.pop("XLA_FLAGS", None)
  port = str(free_port())
  return [subprocess.Popen(
      [sys.executable, "-c", _SHARED_SCRIPT, port, str(i),
       str(w)], cwd=REPO, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i, w in enumerate(workdirs)]


def _outputs(procs):
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return [out for out, _ in outs]


@pytest.mark.slow
def test_multiprocess_workdir_check_and_preemption_sync(tmp_path):
  # Each process gets its own directory: what a local path on each host of
  # a multi-host slice is. And, as a control, one directory both see.
  separate = _start_pair([tmp_path / "host0", tmp_path / "host1"])
  shared = _start_pair([tmp_path / "shared", tmp_path / "shared"])
  for out in _outputs(separate):
    assert "REFUSED" in out and "process(es) [1] of 2 cannot see" in out, out
  outs = _outputs(shared)
  assert all("SHARED" in out for out in outs), outs
  # And multi-host preemption: both processes agree on the step to save.
  sync = [re.findall(r"SYNC (\d+)", out) for out in outs]
  assert sync[0] == sync[1] and len(sync[0]) == 1, outs
  assert int(sync[0][0]) >= 20
