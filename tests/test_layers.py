"""The folder list shows the layers, and the layers hold: import-linter's contract, and no printing below the CLI."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LOWER = ("plan", "render", "host", "engine", "run")


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    command = Path(sys.executable).with_name("lint-imports")
    if not command.exists():
        pytest.fail(f"no lint-imports beside {sys.executable}: install tflab with its test extra (pip install -e '.[test]')")
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run([str(command), "--no-cache"], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def test_the_layer_contract_holds() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "layers: cli > run > engine > host > render > plan KEPT" in done.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tflab", tmp_path / "tflab", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "examples", "images", "templates", "schemas"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    topology = tmp_path / "tflab" / "plan" / "topology.py"
    topology.write_text(topology.read_text() + "\n\nfrom tflab.run import launcher  # a plan that knows the launcher\n")
    done = lint_imports(tmp_path, pythonpath=tmp_path)
    assert done.returncode != 0
    assert "layers: cli > run > engine > host > render > plan BROKEN" in done.stdout
    assert "tflab.plan.topology -> tflab.run.launcher" in done.stdout


def printing_calls(path: Path) -> list[str]:
    """Calls that write to the terminal: print(), sys.stdout/stderr writes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            found.append(f"{path.relative_to(REPO)}:{node.lineno} print()")
        elif (isinstance(func, ast.Attribute) and func.attr in ("write", "flush")
              and isinstance(func.value, ast.Attribute) and func.value.attr in ("stdout", "stderr")
              and isinstance(func.value.value, ast.Name) and func.value.value.id == "sys"):
            found.append(f"{path.relative_to(REPO)}:{node.lineno} sys.{func.value.attr}.{func.attr}()")
    return found


def test_only_the_command_line_prints() -> None:
    found = [hit for layer in LOWER for path in sorted((REPO / "tflab" / layer).glob("*.py"))
             for hit in printing_calls(path)]
    assert found == []


def test_every_module_sits_in_a_layer() -> None:
    top = sorted(p.name for p in (REPO / "tflab").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "errors.py", "resources.py"]


def test_the_run_state_machine_imports_with_no_engine() -> None:
    """run/machine.py is pure: it imports (and decides a run) with the docker SDK absent (issue 25)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['docker'] = None\n"
            "from tflab.run.machine import Began, RunMachine, RunPlan, Serving\n"
            "m = RunMachine(RunPlan(servers=('ps0',), finishers=('worker0',), chief='worker0'))\n"
            "m.handle(Began(0.0)); print(m.handle(Serving('ps0', 1.0))[-1])\n"
            "print(sorted(n for n in sys.modules if n.startswith('tflab.engine')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert "worker0" in done.stdout.splitlines()[0]


def import_graph() -> dict[str, set[str]]:
    """Every tflab module and the tflab modules it imports, anywhere in it (a function's own imports too)."""
    import ast

    root = Path(__file__).resolve().parent.parent
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (root / "tflab").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tflab"):
                for alias in node.names:  # `from tflab.cli import runs` imports the module tflab.cli.runs
                    edges.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths
                              else node.module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("tflab"))
    return {m: {e for e in edges if e in paths and e != m} for m, edges in graph.items()}


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = import_graph()
    assert "tflab.engine.compose_lab" in graph["tflab.engine.sides"]
    seen: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for other in sorted(graph[module]):
            if seen.get(other) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(other):] + [other]))
            if other not in seen:
                visit(other, path + [other])
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])


def test_every_module_is_one_job_a_newcomer_can_read() -> None:
    """Each module in tflab/ opens with a docstring whose first line says its job (issue 25; its length is a hint,
    not a rule: issue 36)."""
    undocumented = []
    for path in sorted((REPO / "tflab").rglob("*.py")):
        if "examples" in path.parts:
            continue  # the programs a lab runs, not tflab's code
        source = path.read_text()
        doc = ast.get_docstring(ast.parse(source))
        if not doc or len(doc.splitlines()[0].split()) < 3:
            undocumented.append(str(path.relative_to(REPO)))
    assert not undocumented, undocumented
