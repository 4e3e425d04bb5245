"""The package layering, read from the source: no cycles, no upward imports.

Layers, lowest first (docs/architecture.md): config_lib; models; data;
checkpoints; hf; objectives; families; tasks; compose; pretrained;
training; downstream; error_reports (where library reports go once a run
failed); the modules the commands share (cli, export, import_hf;
benchmarking, the speed tools' harness); the entry points. A module may
import its own layer's package and anything below; nothing imports an entry
point.
An import inside a function is allowed only where it defers a heavy
dependency (TensorFlow, torch, transformers, libtpu: seconds and hundreds of
MB at import), directly or through a module of ours that imports one at
module level, and it says so in a comment on its line.
"""

from __future__ import annotations

import ast
import os
import re

from tests.helpers import REPO

PACKAGE = os.path.join(REPO, "bert_jax")
LAYERS = (
    ("bert_jax.config_lib",),
    ("bert_jax.models",),
    ("bert_jax.data",),
    ("bert_jax.checkpoints",),
    ("bert_jax.hf",),
    ("bert_jax.objectives",),
    ("bert_jax.families",),
    ("bert_jax.tasks",),
    ("bert_jax.compose",),
    ("bert_jax.pretrained",),
    ("bert_jax.training",),
    ("bert_jax.downstream",),
    ("bert_jax.error_reports",),
    ("bert_jax.cli", "bert_jax.export", "bert_jax.import_hf",
     "bert_jax.benchmarking"),
    ("bert_jax.main", "bert_jax.finetune", "bert_jax.fill_mask",
     "bert_jax.embed", "bert_jax.zero_shot", "bert_jax.to_hf",
     "bert_jax.from_hf", "bert_jax.average", "bert_jax.pretokenize",
     "bert_jax.evaluate_embeddings"),
)
ENTRY_POINTS = LAYERS[-1]
# Third-party packages worth deferring to the function that needs them.
HEAVY = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "torch",
         "transformers", "libtpu")


def _modules() -> dict[str, str]:
  """bert_jax module name -> file path."""
  out = {}
  for root, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(root, f)
        rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  return out


MODULES = _modules()


def _layer(module: str) -> int:
  for i, names in enumerate(LAYERS):
    if any(module == n or module.startswith(n + ".") for n in names):
      return i
  raise AssertionError(f"{module} belongs to no layer: add it to LAYERS.")


def _group(module: str) -> str:
  """The package (or top-level module) a module belongs to."""
  parts = module.split(".")
  return ".".join(parts[:2])


def _targets(node) -> list[str]:
  """Names an import statement imports (modules where they are modules)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  base = node.module or ""
  out = []
  for a in node.names:
    full = f"{base}.{a.name}"
    out.append(full if full in MODULES else base)
  return out


def _imports(module: str):
  """(line, text, targets, inside a function) of every import of `module`."""
  path = MODULES[module]
  with open(path) as f:
    src = f.read()
  lines = src.splitlines()
  tree = ast.parse(src)
  in_function, typing_only = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for sub in ast.walk(node):
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
          in_function.add(id(sub))
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      typing_only.update(id(sub) for sub in ast.walk(node))
  for node in ast.walk(tree):
    if id(node) in typing_only:
      continue  # Annotations only: never imported at run time.
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      text = " ".join(l.strip() for l in lines[node.lineno - 1:node.end_lineno])
      yield node.lineno, text, _targets(node), id(node) in in_function


IMPORTS = {m: list(_imports(m)) for m in MODULES}


def _internal(targets):
  return [t for t in targets if t == "bert_jax" or t.startswith("bert_jax.")]


def _heavy_at_import() -> set[str]:
  """Our modules whose module-level imports reach a HEAVY package."""
  heavy = set()
  changed = True
  while changed:
    changed = False
    for m, imports in IMPORTS.items():
      if m in heavy:
        continue
      for _, _, targets, inside in imports:
        if inside:
          continue
        if any(t.split(".")[0] in HEAVY or t in heavy for t in targets):
          heavy.add(m)
          changed = True
          break
  return heavy


def test_every_module_has_a_layer():
  for m in MODULES:
    if m != "bert_jax":
      _layer(m)


def test_no_upward_imports_and_no_entry_point_imported():
  bad = []
  for m, imports in IMPORTS.items():
    if m == "bert_jax":
      continue
    for line, text, targets, _ in imports:
      for t in _internal(targets):
        if t == "bert_jax":
          continue
        if t in ENTRY_POINTS and t != m:
          bad.append(f"{m}:{line} imports the entry point {t}: {text}")
        elif _layer(t) > _layer(m) or (
            _layer(t) == _layer(m) and _group(t) != _group(m)):
          bad.append(f"{m}:{line} imports {t} from a layer above or beside "
                     f"it: {text}")
  assert not bad, "\n".join(bad)


def test_no_import_cycles():
  graph = {m: {t for _, _, ts, _ in imports for t in _internal(ts)
               if t in MODULES and t != m}
           for m, imports in IMPORTS.items()}
  # A package's __init__ is imported before its modules: not a cycle edge.
  graph = {m: {t for t in ts if not m.startswith(t + ".")}
           for m, ts in graph.items()}
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components.
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in graph:
    if v not in index:
      visit(v)
  assert not cycles, cycles


def test_imports_inside_functions_only_defer_heavy_dependencies():
  heavy = _heavy_at_import()
  bad = []
  for m, imports in IMPORTS.items():
    for line, text, targets, inside in imports:
      if not inside:
        continue
      deferred = [t for t in targets
                  if t.split(".")[0] in HEAVY or t in heavy]
      if len(deferred) != len(targets) or "#" not in text:
        bad.append(f"{m}:{line}: {text}")
  assert not bad, ("imports inside functions that defer nothing heavy (move "
                   "them to the top) or say not why (add a comment):\n"
                   + "\n".join(bad))


def test_no_module_over_500_lines():
  sizes = {}
  for m, path in MODULES.items():
    with open(path) as f:
      sizes[m] = sum(1 for _ in f)
  assert not {m: n for m, n in sizes.items() if n > 500}


def _python_files(*folders):
  for folder in folders:
    for root, _, files in os.walk(os.path.join(REPO, folder)):
      for f in files:
        if f.endswith(".py"):
          yield os.path.join(root, f)


def test_no_sys_path_edits_in_tools_or_tests():
  """Tools and tests import the installed package (pip install -e .)."""
  # A pattern, not the literal calls, so this file needs no exemption.
  edit = re.compile(r"\bsys\.path\.(insert|append)\b")
  bad = []
  for path in _python_files("tools", "tests", "bert_jax"):
    with open(path) as f:
      for i, line in enumerate(f, 1):
        if edit.search(line):
          bad.append(f"{os.path.relpath(path, REPO)}:{i}")
  assert not bad, bad


def test_no_test_module_imports_another():
  """Shared test code lives in tests/helpers, not in test modules."""
  bad = []
  for path in _python_files("tests"):
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        names = [f"{node.module}.{a.name}" for a in node.names]
      elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      else:
        continue
      for name in names:
        if name.startswith("tests.") and any(
            part.startswith("test_") for part in name.split(".")[1:]):
          bad.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {name}")
  assert not bad, bad
