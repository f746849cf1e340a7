"""Benchmarks, tests and scripts import packages; none edits the import path to find them.

From the repository root, ``python -m bench.NAME`` and pytest put the root on sys.path, and
the interpreter's install of this checkout supplies ``rallypoint``: so no module touches
``sys.path``, none sets PYTHONPATH in its own environment, and a benchmark imports its
siblings as ``bench.NAME``. A child process's env may still carry PYTHONPATH (an A/B runs
another checkout's src/ that way).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.commands import python
from tests.support.env import child_env

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
SCANNED = sorted(
    [*BENCH.glob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py")]
)
BENCH_MODULES = frozenset(path.stem for path in BENCH.glob("*.py")) - {"__init__"}
#: What changes the process's own PYTHONPATH when called with "PYTHONPATH" first.
ENV_SETTERS = {"setdefault", "putenv", "setenv"}


def _is_attribute(node: ast.AST, module: str, name: str) -> bool:
    """Whether ``node`` spells ``module.name`` (``sys.path``, ``os.environ``)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == module
    )


def _is_sys_path(node: ast.AST) -> bool:
    return _is_attribute(node, "sys", "path")


def _is_os_environ(node: ast.AST) -> bool:
    return _is_attribute(node, "os", "environ")


def _names_pythonpath(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == "PYTHONPATH"


def _sets_own_pythonpath(node: ast.AST) -> bool:
    """``os.environ["PYTHONPATH"] = ...`` (or ``del``), ``os.environ.update(PYTHONPATH=...)``,
    ``os.environ.update({"PYTHONPATH": ...})``, ``os.putenv("PYTHONPATH", ...)`` and the like."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
        return _is_os_environ(node.value) and _names_pythonpath(node.slice)
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    method = node.func.attr
    if method in ENV_SETTERS:
        return bool(node.args) and _names_pythonpath(node.args[0])
    if method == "update" and _is_os_environ(node.func.value):
        keys = [kw.arg for kw in node.keywords]
        for arg in node.args:
            if isinstance(arg, ast.Dict):
                keys += [key.value for key in arg.keys if isinstance(key, ast.Constant)]
        return "PYTHONPATH" in keys
    return False


def _sibling_import(node: ast.AST) -> str | None:
    """A benchmark module imported by its bare name (``import common``), as a script would."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
    else:
        return None
    return next((name for name in names if name.split(".")[0] in BENCH_MODULES), None)


def path_edits(path: Path) -> list[str]:
    """``line: what`` for every import path edit in ``path``."""
    found: list[str] = []
    in_bench = path.parent.name == "bench"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if _is_sys_path(node):
            found.append(f"{line}: sys.path")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            if any(alias.name == "path" for alias in node.names):
                found.append(f"{line}: from sys import path")
        elif _sets_own_pythonpath(node):
            found.append(f"{line}: sets this process's PYTHONPATH")
        elif in_bench and (name := _sibling_import(node)):
            found.append(f"{line}: imports {name} as a script would (bench.{name})")
    return found


def test_the_scan_sees_benchmarks_tests_and_scripts() -> None:
    names = {path.relative_to(REPO).as_posix() for path in SCANNED}
    assert {"bench/common.py", "bench/scale.py", "tests/support/cluster/build.py"} <= names
    assert "scripts/busy.py" in names
    assert {"common", "simcluster", "time_to_ready"} <= BENCH_MODULES


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.path.insert(0, 'src')\n",
        "import sys\nsys.path[:0] = ['src']\n",
        "import sys\nfor p in sys.path:\n    print(p)\n",
        "from sys import path\n",
        "import os\nos.environ['PYTHONPATH'] = 'src'\n",
        "import os\nos.environ['PYTHONPATH'] += ':src'\n",
        "import os\ndel os.environ['PYTHONPATH']\n",
        "import os\nos.environ.setdefault('PYTHONPATH', 'src')\n",
        "import os\nos.environ.update(PYTHONPATH='src')\n",
        "import os\nos.environ.update({'PYTHONPATH': 'src'})\n",
        "import os\nos.putenv('PYTHONPATH', 'src')\n",
        "def test(monkeypatch):\n    monkeypatch.setenv('PYTHONPATH', 'src')\n",
    ],
)
def test_the_scan_finds_a_planted_edit(tmp_path: Path, source: str) -> None:
    path = tmp_path / "planted.py"
    path.write_text(source)
    assert path_edits(path)


@pytest.mark.parametrize("source", ["import common\n", "from time_to_ready import each_cluster\n"])
def test_the_scan_finds_a_benchmark_imported_as_a_script(tmp_path: Path, source: str) -> None:
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "planted.py"
    path.write_text(source)
    assert path_edits(path)


@pytest.mark.parametrize(
    "source",
    [
        # A child's environment, as the A/B modes give another checkout's src/.
        "import os, subprocess\nsubprocess.run(['x'], env=dict(os.environ, PYTHONPATH='src'))\n",
        "import os\nenv = {**os.environ, 'PYTHONPATH': 'src'}\n",
        "import os\nprint(os.environ.get('PYTHONPATH'))\n",
        "import os.path\nprint(os.path.join('a', 'b'))\n",
        "from bench import common\nfrom bench.time_to_ready import each_cluster\n",
    ],
)
def test_the_scan_lets_a_child_environment_and_reads_pass(tmp_path: Path, source: str) -> None:
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "allowed.py"
    path.write_text(source)
    assert path_edits(path) == []


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_module_edits_the_import_path(path: Path) -> None:
    edits = path_edits(path)
    assert not edits, (
        f"{path.relative_to(REPO)} edits the import path ({edits}): import packages from the "
        "repository root (python -m bench.NAME, tests.support...) and rallypoint from the "
        "interpreter's install; give another checkout's src/ to a child's env only"
    )


def test_every_benchmark_imports_as_a_package_from_the_repository_root() -> None:
    """What ``python -m bench.NAME`` does: the root first on sys.path, no PYTHONPATH."""
    modules = ", ".join(f"bench.{name}" for name in sorted(BENCH_MODULES))
    env = {key: value for key, value in child_env().items() if key != "PYTHONPATH"}
    done = python("-c", f"import {modules}", cwd=REPO, env=env, timeout_s=120)
    assert done.returncode == 0, done.stderr[-2000:]
