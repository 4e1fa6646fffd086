"""The code passes flake8 with the repo's settings (setup.cfg), so lint is part of CI instead of a habit."""
import subprocess
import sys

from conftest import REPO


def test_flake8_is_clean():
    proc = subprocess.run([sys.executable, '-m', 'flake8', 'mmvisatt', 'tests', 'tools', 'configs', 'setup.py'],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def _package_imports():
    """(importing package, imported package, imported names) for every import between packages of mmvisatt."""
    import ast
    import os
    root = os.path.join(REPO, 'mmvisatt')
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
            package = parts[1] if len(parts) > 1 and parts[1] != '__init__' else ''
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom):
                    base = parts[:-1] if node.level else []
                    if node.level > 1:
                        base = base[:len(base) - node.level + 1]
                    target = (base + (node.module or '').split('.')) if node.level else (node.module or '').split('.')
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    found += [(package, a.name.split('.')[1], []) for a in node.names
                              if a.name.startswith('mmvisatt.') and package]
                    continue
                else:
                    continue
                target = [t for t in target if t]
                if len(target) > 1 and target[0] == 'mmvisatt' and package and target[1] != package:
                    found.append((package, target[1], names))
    return found


def test_packages_import_each_other_in_one_direction_and_no_private_names():
    imports = _package_imports()
    graph = {}
    for source, target, _ in imports:
        graph.setdefault(source, set()).add(target)

    def reachable(start):
        seen, stack = set(), [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    assert [p for p in graph if p in reachable(p)] == [], graph
    assert [(s, t, n) for s, t, names in imports for n in names if n.startswith('_') and not n.endswith('__')] == []
