"""The code passes flake8 with the repo's settings (setup.cfg), so lint is part of CI instead of a habit."""
import subprocess
import sys

from conftest import REPO


def test_flake8_is_clean():
    proc = subprocess.run([sys.executable, '-m', 'flake8', 'mmvisatt', 'tests', 'tools', 'configs', 'setup.py'],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
