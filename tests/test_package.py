"""The package's shape and import graph: subpackages in the order data flows and a few modules at
the top, no cycles, no import from a room to a later one (lazy imports and the registries'
``module:function`` names included), every module importable on its own, and the commands that
only read files (``gmc figures``, ``gmc mlflow-sync``) never load torch."""

import ast
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gmc
from gmc.sweep.points import Delay

PACKAGE = Path(gmc.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if _module_name(p) != "gmc"}
"""Every module of the package, its subpackages' included, by dotted name."""


MODULES = sorted(FILES)


def imported_gmc_modules(path: Path) -> set[str]:
    """The ``gmc`` modules a file imports anywhere (top level or inside a function, so lazy
    imports count): ``import gmc.x``, ``from gmc import x``, ``from gmc.x import y`` (and
    ``gmc.x.y`` where ``y`` is itself a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("gmc.")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module == "gmc" or node.module.startswith("gmc."))
        ):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out & set(MODULES)


def import_graph() -> dict[str, set[str]]:
    return {m: imported_gmc_modules(path) for m, path in FILES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_detects_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert imported_gmc_modules(PACKAGE / "run" / "trainer.py") >= {"gmc.io", "gmc.policy.model"}
    assert {"gmc.rollouts.ray.source", "gmc.rollouts.ray.worker", "gmc.rollouts.delays"} <= set(MODULES)
    # lazy imports inside functions count
    assert "gmc.rollouts.ray.worker" in imported_gmc_modules(PACKAGE / "rollouts" / "ray" / "pool.py")


ROOMS = ("tasks", "estimators", "policy", "rollouts", "run", "sweep", "results", "theory", "integrations")
"""The subpackages in the order data flows, then gmc's corrections inside other trainers; a module
imports from its own room and those before it."""
OPTIONAL = {"gmc.integrations.trl": ("trl", 'pip install "gmc[trl]"')}
"""Modules that need an optional package at import, with what their one-line error says to run
where the package is absent."""
GROUND = ("gmc.settings", "gmc.io", "gmc.stop")
"""Top-level modules every room may import; they import none of the rooms."""
ROOF = ("gmc.cli", "gmc.__main__", "gmc.workflow", "gmc.quickstart")
"""The entry points above every room: the command line, its quick start and what the Snakemake workflow reads."""


def room(module: str) -> int:
    """0 for the ground, 1.. for the rooms in :data:`ROOMS` order, then the roof."""
    if module in GROUND:
        return 0
    if module in ROOF:
        return len(ROOMS) + 1
    return ROOMS.index(module.split(".")[1]) + 1


NAMED = re.compile(r"^(gmc(?:\.\w+)+):(\w+)$")
"""A registry's name of code it does not import: ``module:function``."""


def named_code(path: Path) -> set[tuple[str, str]]:
    """The ``module:function`` strings a file holds (registry entries)."""
    return {
        (m[1], m[2])
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := NAMED.match(node.value))
    }


def test_the_package_is_its_rooms_and_a_few_top_level_modules():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10 and {f"gmc.{m}" for m in top} == {*GROUND, *ROOF, "gmc.__init__"}
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    assert all(room(m) is not None for m in MODULES)


def test_no_module_imports_from_a_later_room():
    """Imports (lazy ones too) and registry names run from a room to itself or an earlier one."""
    up = []
    for module, path in FILES.items():
        targets = imported_gmc_modules(path) | {m for m, _ in named_code(path)}
        up += [f"{module} -> {t}" for t in sorted(targets) if t != "gmc" and room(t) > room(module)]
    assert not up, up


def test_every_registry_name_is_real_code():
    names = {n for path in FILES.values() for n in named_code(path)}
    assert len(names) >= 20  # estimators, delay modes and their checks, engines, tables, figures
    for module, function in sorted(names):
        assert callable(getattr(importlib.import_module(module), function)), f"{module}:{function}"


def test_no_import_cycles():
    """Across the whole package, subpackages and lazy imports included; a registry names code in
    a room above it as ``module:function``, never by importing it."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_delay_is_parsed_in_one_place():
    """A point's delay is a value type (``gmc.sweep.points.Delay``) parsed once: no other line of the
    package or of the workflow's rules asks whether a delay is a number."""
    root = PACKAGE.parent
    files = [
        *FILES.values(),
        root / "Snakefile",
        *(root / "workflow").rglob("*.smk"),
        *(root / "workflow").rglob("*.py"),
    ]
    found = [
        f"{path.relative_to(root)}:{i}"
        for path in files
        for i, line in enumerate(path.read_text().splitlines(), start=1)
        if "isdigit" in line or "isdecimal" in line or "isnumeric" in line
    ]
    assert len(found) == 1 and found[0].startswith("gmc/sweep/points.py:")
    assert "isdigit" in inspect.getsource(Delay.parse)


def test_the_delay_modes_registry_imports_no_source():
    assert imported_gmc_modules(FILES["gmc.rollouts.delays"]) == {"gmc.settings", "gmc.estimators"}


PEERS = {"gmc.integrations.verl": "verl", "gmc.integrations.verl_trainer": "transfer_queue"}
"""The modules that import another framework, and the module without which they cannot import."""


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_in_a_fresh_interpreter(module):
    if module in PEERS and importlib.util.find_spec(PEERS[module]) is None:
        pytest.skip(f"{module} needs {PEERS[module]} (make test-peers)")
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    package, install = OPTIONAL.get(module, (None, None))
    if package is not None and importlib.util.find_spec(package) is None:
        assert done.returncode != 0 and install in done.stderr.strip().splitlines()[-1], done.stderr
    else:
        assert done.returncode == 0, done.stderr


def _loads_torch(argv: list[str], cwd: Path) -> dict:
    """Run ``gmc <argv>`` in a fresh interpreter; report its exit code and whether torch loaded."""
    code = (
        "import json, sys\nfrom gmc.cli import main\n"
        f"rc = main({argv!r})\n"
        "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_reading_commands_do_not_load_torch(tmp_path, make_run_dir):
    results = tmp_path / "results"
    run = make_run_dir(results)
    make_run_dir(results, algo="grpo")
    assert _loads_torch(["mlflow-sync", str(run), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"], tmp_path) == {
        "rc": 0,
        "torch": False,
    }
    assert _loads_torch(["figures", "--results", str(results)], tmp_path) == {"rc": 0, "torch": False}
    assert (results / "figures" / "reward_vs_step.png").exists()
