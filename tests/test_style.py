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


def test_every_layers_module_serves_two_backbone_files():
    """``models/layers`` holds what two or more backbone files use (directly or through another layers module);
    what one architecture alone uses lives in its backbone file, and nothing in ``layers`` imports a family."""
    import ast
    import os
    models = os.path.join(REPO, 'mmvisatt', 'models')

    def layer_imports(path):
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module.split('.')
                if module[:-1] == ['layers'] or module[:3] == ['mmvisatt', 'models', 'layers']:
                    found.add(module[-1])
                elif node.level == 1 and len(module) == 1:
                    found.add(module[0])
        return found

    layers = {name[:-3] for name in os.listdir(os.path.join(models, 'layers'))
              if name.endswith('.py') and name != '__init__.py'}
    uses = {name: layer_imports(os.path.join(models, 'layers', name + '.py')) & layers for name in layers}
    users = {name: set() for name in layers}
    for name in os.listdir(os.path.join(models, 'backbones')):
        if name.endswith('.py') and name not in ('__init__.py', 'base.py'):
            stack = list(layer_imports(os.path.join(models, 'backbones', name)) & layers)
            while stack:
                module = stack.pop()
                if name not in users[module]:
                    users[module].add(name)
                    stack += uses[module]
    assert {m: sorted(u) for m, u in users.items() if len(u) < 2} == {}
    for name in layers:
        source = open(os.path.join(models, 'layers', name + '.py')).read()
        assert 'backbones' not in ''.join(line for line in source.splitlines() if 'import' in line), name
