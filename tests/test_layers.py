"""Import contracts: the layers of DESIGN.md and the order inside sparrow_core, read from source.

Every module's imports (module level and inside functions alike) are parsed with ast, never
executed, and checked against:
- packages: pipelines -> tasks -> (runtime, reports) -> (sparrow_core, storage), with
  sparrow_cli on top; a package imports only its own layer or those below it, never one beside
  it (runtime and reports know nothing of each other); storage takes from sparrow_core only
  STORAGE_MAY_IMPORT;
- sparrow_core imports no orchestrator or store (ORCHESTRATORS); storage imports no torch
  (TENSOR_LIBRARIES); runtime imports no Prefect (the stage tasks and flows are Prefect's);
  reports imports no orchestrator either (it reads DuckDB through storage, draws with
  matplotlib, and the tasks that call it are Prefect's);
- inside sparrow_core, CORE_LAYERS lowest first: a module imports only its own layer or those
  below. A new module falls in the layer of its longest listed prefix; a module that fits no
  prefix fails until it is given a layer.
Each failure names the file, the line and the import. Run: `python -m pytest tests/test_layers.py -q`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; sparrow_core and storage sit side by side at the bottom, runtime and reports
# side by side above them
PACKAGE_LAYERS = (("sparrow_core", "storage"), ("runtime", "reports"), ("tasks",),
                  ("pipelines",), ("sparrow_cli",))
STORAGE_MAY_IMPORT = ("sparrow_core.errors",)
ORCHESTRATORS = ("prefect", "ray", "mlflow", "duckdb")
TENSOR_LIBRARIES = ("torch", "triton", "transformers", "peft")
FLOW_ENGINES = ("prefect",)

# the order inside sparrow_core, lowest first (module prefixes; the longest listed prefix wins)
CORE_LAYERS = (
    ("base", ("sparrow_core.errors", "sparrow_core.registry", "sparrow_core.schedule_math",
              "sparrow_core.config.schema", "sparrow_core.token_arrays",
              "sparrow_core.cuda_memory")),
    ("mismatch", ("sparrow_core.mismatch", "sparrow_core.mismatch_fit",
                  "sparrow_core.mismatch_stats")),
    ("data", ("sparrow_core.data",)),
    # the schedule and the selection rule: below kernels, which launch the selection
    ("schedule", ("sparrow_core.sparse",)),
    ("costmodel", ("sparrow_core.costmodel", "sparrow_core.costmodel_presets",
                   "sparrow_core.costmodel_segments")),
    ("kernels", ("sparrow_core.kernels",)),
    ("model", ("sparrow_core.model",)),
    # the project's engine and the vLLM backend behind the same interface
    ("engine", ("sparrow_core.engine", "sparrow_core.vllm")),
    # calibration and the online controller replay sequences on the engine
    ("control", ("sparrow_core.control",)),
    ("rl", ("sparrow_core.rl",)),
    # config.load checks loss and estimator names against rl's registries
    ("top", ("sparrow_core.config", "sparrow_core.study", "sparrow_core.testbed")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    return sorted(p for top in {t for layer in PACKAGE_LAYERS for t in layer}
                  for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


MODULES = {module_name(p): p for p in source_files()}


def imports_of(path: Path) -> list[tuple[int, str]]:
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import in a module's source; `from pkg import sub` names
    pkg.sub when sub is a project module; relative imports are resolved."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if sub in MODULES else base))
    return out


def top(module: str) -> str:
    return module.split(".")[0]


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def package_rank(package: str) -> int | None:
    return next((i for i, layer in enumerate(PACKAGE_LAYERS) if package in layer), None)


def core_layer(module: str) -> int | None:
    if module == "sparrow_core":
        return 0
    best = None
    for i, (_, prefixes) in enumerate(CORE_LAYERS):
        for p in prefixes:
            if within(module, [p]) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def where(path: Path, line: int, imported: str) -> str:
    return f"{path.relative_to(ROOT)}:{line} imports {imported}"


def layer_breaks(name: str, imports: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, module, why) for every import of module `name` that breaks the package order."""
    rank, out = package_rank(top(name)), []
    for line, imported in imports:
        other = package_rank(top(imported))
        if other is None or top(imported) == top(name):
            continue
        if other > rank:
            out.append((line, imported, f"{top(name)} is below {top(imported)}"))
        elif other == rank and not (top(name) == "storage"
                                    and within(imported, STORAGE_MAY_IMPORT)):
            # side by side: only storage's listed exceptions
            out.append((line, imported, f"{top(name)} and {top(imported)} sit side by side"))
    return out


def forbidden_in(imports: list[tuple[int, str]], forbidden) -> list[tuple[int, str]]:
    return [(line, imported) for line, imported in imports if top(imported) in forbidden]


def test_packages_import_only_their_layer_or_below():
    bad = [f"{where(path, line, imported)}: {why}" for name, path in MODULES.items()
           for line, imported, why in layer_breaks(name, imports_of(path))]
    assert not bad, "layer order pipelines -> tasks -> (runtime, reports) -> " \
        "(sparrow_core, storage) broken:\n" + "\n".join(bad)


@pytest.mark.parametrize("package, forbidden", [("sparrow_core", ORCHESTRATORS),
                                                ("storage", TENSOR_LIBRARIES),
                                                ("runtime", FLOW_ENGINES),
                                                ("reports", ORCHESTRATORS)])
def test_packages_keep_out_of_the_dependencies_above_them(package, forbidden):
    bad = [f"{where(path, line, imported)}: {package} must not import {top(imported)}"
           for name, path in MODULES.items() if top(name) == package
           for line, imported in forbidden_in(imports_of(path), forbidden)]
    assert not bad, "\n".join(bad)


def test_sparrow_core_modules_import_only_their_layer_or_below():
    names = [layer for layer, _ in CORE_LAYERS]
    bad, unplaced = [], []
    for name, path in MODULES.items():
        if top(name) != "sparrow_core":
            continue
        mine = core_layer(name)
        if mine is None:
            unplaced.append(f"{path.relative_to(ROOT)}: give {name} a layer in CORE_LAYERS")
            continue
        for line, imported in imports_of(path):
            theirs = core_layer(imported) if top(imported) == "sparrow_core" else None
            if theirs is not None and theirs > mine:
                bad.append(f"{where(path, line, imported)}: layer {names[mine]} is below "
                           f"{names[theirs]}")
    assert not unplaced, "\n".join(unplaced)
    assert not bad, "order inside sparrow_core (" + " < ".join(names) + ") broken:\n" + \
        "\n".join(bad)


def test_the_checks_see_imports_and_catch_a_violation():
    # the order the contracts encode, as DESIGN.md states it
    assert core_layer("sparrow_core.sparse.schedule") < core_layer("sparrow_core.kernels.page_topk")
    assert core_layer("sparrow_core.kernels.paged_decode") < core_layer("sparrow_core.model.layers")
    assert core_layer("sparrow_core.model.decoder") < core_layer("sparrow_core.engine.engine")
    assert core_layer("sparrow_core.engine.engine") < core_layer("sparrow_core.control.calibration")
    assert core_layer("sparrow_core.engine.engine") < core_layer("sparrow_core.rl.trainer")
    assert package_rank("storage") == package_rank("sparrow_core") < package_rank("runtime")
    assert package_rank("runtime") < package_rank("tasks") < package_rank("pipelines")
    assert package_rank("storage") < package_rank("reports") == package_rank("runtime")
    assert package_rank("reports") < package_rank("tasks")
    # lazy and relative imports are seen, and an upward one lands above its importer
    probe = "sparrow_core.engine.probe"
    source = "def f():\n    from sparrow_core.rl import trainer\n    from .. import mismatch\n"
    found = imports_in(source, probe)
    assert found == [(2, "sparrow_core.rl.trainer"), (3, "sparrow_core.mismatch")]
    assert core_layer(found[0][1]) > core_layer(probe) > core_layer(found[1][1])
    assert imports_in("from . import engine, kv_cache", "sparrow_core.engine", is_package=True) == [
        (1, "sparrow_core.engine.engine"), (1, "sparrow_core.engine.kv_cache")]


def test_reports_take_only_storage_and_sparrow_core():
    assert any(top(name) == "reports" for name in MODULES), "reports/ is not read"
    source = ("import prefect\nfrom tasks.calibrate import policy\nfrom runtime import stage\n"
              "from storage.report_rows import run_tables\nfrom sparrow_core import mismatch_fit\n"
              "from pipelines.train import train_flow\nimport matplotlib\n")
    found = imports_in(source, "reports.probe")
    assert [(line, why) for line, _, why in layer_breaks("reports.probe", found)] == [
        (2, "reports is below tasks"), (3, "reports and runtime sit side by side"),
        (6, "reports is below pipelines")]
    assert forbidden_in(found, ORCHESTRATORS) == [(1, "prefect")]
    # nor does runtime take from reports; tasks and the CLI may
    assert layer_breaks("runtime.probe", imports_in("from reports import run", "runtime.probe")) \
        == [(1, "reports.run", "runtime and reports sit side by side")]
    assert layer_breaks("tasks.probe", imports_in("from reports import study", "tasks.probe")) == []
