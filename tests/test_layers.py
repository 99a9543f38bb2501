"""Import contracts: the layers of docs/architecture.md, read from source.

Every module's imports (module level and inside functions alike) are parsed with ast, never
executed. The one package `sparrow` has roles, named by its folders; a module's role is its
folder under sparrow/ when that folder is one of the system roles (storage, runtime, reports,
stages, flows, cli), else `library` (the torch library: engine, kernels, model, rl, trainer...).
Checked:
- roles: cli -> flows -> stages -> (runtime, reports) -> (library, storage); a module imports
  only its own role, or roles below it, never one beside it (runtime and reports know nothing
  of each other); storage takes from the library only STORAGE_MAY_IMPORT;
- the library imports no orchestrator or store (ORCHESTRATORS); storage imports no torch
  (TENSOR_LIBRARIES); runtime imports no Prefect (the stage tasks and flows are Prefect's);
  reports imports no orchestrator either (it reads DuckDB through storage, draws with
  matplotlib, and the tasks that call it are Prefect's);
- inside the library, LIBRARY_LAYERS lowest first: a module imports only its own layer or those
  below. A new module falls in the layer of its longest listed prefix; a module that fits no
  prefix fails until it is given a layer.
Each failure names the file, the line and the import. Run: `python -m pytest tests/test_layers.py -q`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparrow"

# lowest first; the library and storage sit side by side at the bottom, runtime and reports
# side by side above them
PACKAGE_LAYERS = (("library", "storage"), ("runtime", "reports"), ("stages",), ("flows",), ("cli",))
SYSTEM_ROLES = {"storage", "runtime", "reports", "stages", "flows", "cli"}
STORAGE_MAY_IMPORT = ("sparrow.errors", "sparrow.scratch")
ORCHESTRATORS = ("prefect", "ray", "mlflow", "duckdb")
TENSOR_LIBRARIES = ("torch", "triton", "transformers", "peft")
FLOW_ENGINES = ("prefect",)

# the order inside the library, lowest first (module prefixes; the longest listed prefix wins)
LIBRARY_LAYERS = (
    (
        "base",
        (
            "sparrow.errors",
            "sparrow.registry",
            "sparrow.schedule_math",
            "sparrow.config.schema",
            "sparrow.token_arrays",
            "sparrow.cuda_memory",
            "sparrow.scratch",
            "sparrow.cache",
        ),
    ),
    ("mismatch", ("sparrow.mismatch",)),
    # the RL mathematics (advantages, losses, aggregation): tensors in, tensors out
    ("rl", ("sparrow.rl",)),
    ("data", ("sparrow.data",)),
    # the schedule and the selection rule: below kernels, which launch the selection
    ("schedule", ("sparrow.sparse",)),
    ("costmodel", ("sparrow.costmodel",)),
    ("kernels", ("sparrow.kernels",)),
    ("model", ("sparrow.model",)),
    # the project's engine and the vLLM backend behind the same interface
    ("engine", ("sparrow.engine", "sparrow.vllm")),
    # calibration and the online controller replay sequences on the engine
    ("control", ("sparrow.control",)),
    # the trainer system: scoring, updates, checkpoints, LoRA, weights to the engines
    ("trainer", ("sparrow.trainer",)),
    # config.load checks loss and estimator names against rl's registries; the experiments sit
    # on everything
    ("top", ("sparrow.config", "sparrow.experiments")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    return sorted(p for p in (ROOT / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts)


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
    """A project module's role (`library` or a system role); an outside module's top name."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return parts[0]
    return parts[1] if len(parts) > 1 and parts[1] in SYSTEM_ROLES else "library"


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def package_rank(package: str) -> int | None:
    return next((i for i, layer in enumerate(PACKAGE_LAYERS) if package in layer), None)


def core_layer(module: str) -> int | None:
    if module == PACKAGE:
        return 0
    best = None
    for i, (_, prefixes) in enumerate(LIBRARY_LAYERS):
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
        elif other == rank and not (
            top(name) == "storage" and within(imported, STORAGE_MAY_IMPORT)
        ):
            # side by side: only storage's listed exceptions
            out.append((line, imported, f"{top(name)} and {top(imported)} sit side by side"))
    return out


def forbidden_in(imports: list[tuple[int, str]], forbidden) -> list[tuple[int, str]]:
    return [(line, imported) for line, imported in imports if top(imported) in forbidden]


def test_packages_import_only_their_layer_or_below():
    bad = [
        f"{where(path, line, imported)}: {why}"
        for name, path in MODULES.items()
        for line, imported, why in layer_breaks(name, imports_of(path))
    ]
    assert not bad, (
        "role order cli -> flows -> stages -> (runtime, reports) -> "
        "(library, storage) broken:\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("library", ORCHESTRATORS),
        ("storage", TENSOR_LIBRARIES),
        ("runtime", FLOW_ENGINES),
        ("reports", ORCHESTRATORS),
    ],
)
def test_packages_keep_out_of_the_dependencies_above_them(package, forbidden):
    bad = [
        f"{where(path, line, imported)}: {package} must not import {top(imported)}"
        for name, path in MODULES.items()
        if top(name) == package
        for line, imported in forbidden_in(imports_of(path), forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_library_modules_import_only_their_layer_or_below():
    names = [layer for layer, _ in LIBRARY_LAYERS]
    bad, unplaced = [], []
    for name, path in MODULES.items():
        if top(name) != "library":
            continue
        mine = core_layer(name)
        if mine is None:
            unplaced.append(f"{path.relative_to(ROOT)}: give {name} a layer in LIBRARY_LAYERS")
            continue
        for line, imported in imports_of(path):
            theirs = core_layer(imported) if top(imported) == "library" else None
            if theirs is not None and theirs > mine:
                bad.append(
                    f"{where(path, line, imported)}: layer {names[mine]} is below {names[theirs]}"
                )
    assert not unplaced, "\n".join(unplaced)
    assert not bad, (
        "order inside the library (" + " < ".join(names) + ") broken:\n" + "\n".join(bad)
    )


def test_the_checks_see_imports_and_catch_a_violation():
    # the order the contracts encode, as docs/architecture.md states it
    assert core_layer("sparrow.rl.losses") < core_layer("sparrow.engine.engine")
    assert core_layer("sparrow.sparse.schedule") < core_layer("sparrow.kernels.page_topk")
    assert core_layer("sparrow.kernels.paged_decode") < core_layer("sparrow.model.layers")
    assert core_layer("sparrow.model.decoder") < core_layer("sparrow.engine.engine")
    assert core_layer("sparrow.engine.engine") < core_layer("sparrow.control.calibration")
    assert core_layer("sparrow.engine.engine") < core_layer("sparrow.trainer.policy_trainer")
    assert top("sparrow.engine.engine") == "library" and top("sparrow.stages.reward") == "stages"
    assert package_rank("storage") == package_rank("library") < package_rank("runtime")
    assert package_rank("runtime") < package_rank("stages") < package_rank("flows")
    assert package_rank("storage") < package_rank("reports") == package_rank("runtime")
    assert package_rank("reports") < package_rank("stages") < package_rank("cli")
    # lazy and relative imports are seen, and an upward one lands above its importer
    probe = "sparrow.engine.probe"
    source = (
        "def f():\n    from sparrow.trainer import policy_trainer\n    from ..mismatch import fit\n"
    )
    found = imports_in(source, probe)
    assert found == [(2, "sparrow.trainer.policy_trainer"), (3, "sparrow.mismatch.fit")]
    assert core_layer(found[0][1]) > core_layer(probe) > core_layer(found[1][1])
    assert imports_in("from . import engine, kv_cache", "sparrow.engine", is_package=True) == [
        (1, "sparrow.engine.engine"),
        (1, "sparrow.engine.kv_cache"),
    ]


def test_reports_take_only_storage_and_the_library():
    assert any(top(name) == "reports" for name in MODULES), "sparrow/reports/ is not read"
    source = (
        "import prefect\nfrom sparrow.stages.calibrate import policy\n"
        "from sparrow.runtime.ledger import stage\n"
        "from sparrow.storage.report_rows import run_tables\nfrom sparrow.mismatch import fit\n"
        "from sparrow.flows.train import train_flow\nimport matplotlib\n"
    )
    found = imports_in(source, "sparrow.reports.probe")
    assert [(line, why) for line, _, why in layer_breaks("sparrow.reports.probe", found)] == [
        (2, "reports is below stages"),
        (3, "reports and runtime sit side by side"),
        (6, "reports is below flows"),
    ]
    assert forbidden_in(found, ORCHESTRATORS) == [(1, "prefect")]
    # nor does runtime take from reports; stages and the CLI may
    assert layer_breaks(
        "sparrow.runtime.probe",
        imports_in("from sparrow.reports import run", "sparrow.runtime.probe"),
    ) == [(1, "sparrow.reports.run", "runtime and reports sit side by side")]
    assert (
        layer_breaks(
            "sparrow.stages.probe",
            imports_in("from sparrow.reports import study", "sparrow.stages.probe"),
        )
        == []
    )
