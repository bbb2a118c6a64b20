"""AnonMRILib runs in Slicer's Python (3.9 in Slicer 5.0-5.6) and loads before heavy packages exist."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "AnonMRILib").rglob("*.py")) + sorted((ROOT / "AnonMRI").rglob("*.py"))
HEAVY = ["torch", "nibabel", "SimpleITK", "scipy", "skimage", "monai", "vtk", "safetensors", "tqdm",
         "matplotlib", "PIL"]


def _has_future_annotations(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body)


def _runtime_annotations(tree: ast.Module):
    """Annotations Python 3.9 evaluates at definition time (function signatures, class/module AnnAssign)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            arguments += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
            yield from (a.annotation for a in arguments if a.annotation is not None)
            if node.returns is not None:
                yield node.returns
    for body in [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        yield from (n.annotation for n in body if isinstance(n, ast.AnnAssign))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_source_is_python_3_9(path):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path), feature_version=(3, 9))
    if _has_future_annotations(tree):
        return
    for annotation in _runtime_annotations(tree):
        for node in ast.walk(annotation):
            assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)), (
                f"{path.name}:{annotation.lineno}: 'X | Y' annotations fail on Python 3.9; use Optional/Union")


def test_library_imports_without_heavy_packages():
    blocker = (
        "import sys\n"
        f"for name in {HEAVY!r}: sys.modules[name] = None\n"
        "import AnonMRILib, AnonMRILib.errors, AnonMRILib.progress, AnonMRILib.device\n"
        "import AnonMRILib.io, AnonMRILib.cli.main\n"
        "assert AnonMRILib.__version__\n"
        "AnonMRILib.cli.main.build_parser()\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _python_3_9():
    """A working Python 3.9 interpreter (PATH or pyenv), or None."""
    candidates = [shutil.which("python3.9")] + sorted(Path.home().glob(".pyenv/versions/3.9*/bin/python3.9"))
    for candidate in filter(None, candidates):
        probe = subprocess.run([str(candidate), "--version"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.startswith("Python 3.9"):
            return str(candidate)
    return None


PYTHON_3_9 = _python_3_9()


@pytest.mark.skipif(PYTHON_3_9 is None, reason="no Python 3.9 interpreter on this machine")
def test_compiles_with_python_3_9(tmp_path):
    files = [str(p) for p in SOURCES]
    result = subprocess.run([PYTHON_3_9, "-m", "py_compile"] + files, capture_output=True, text=True,
                            timeout=300, env={"PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
