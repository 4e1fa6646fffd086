"""README.md and docs/ hold together: every relative link and #anchor resolves, and no page names a path outside
the repository or an issue of the tracker."""
import glob
import os.path as osp
import re

import pytest

from conftest import REPO

PAGES = [osp.join(REPO, 'README.md'), osp.join(REPO, 'CHANGELOG.md')] + \
    sorted(glob.glob(osp.join(REPO, 'docs', '*.md')))
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def anchors(path: str) -> set:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation but '-' and '_' dropped, spaces to
    '-', a repeated one numbered."""
    with open(path) as f:
        text = FENCE.sub('', f.read())
    seen, found = {}, set()
    for heading in re.findall(r'^#{1,6} +(.+?) *#*$', text, re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f'{slug}-{count}')
    return found


@pytest.mark.parametrize('page', PAGES, ids=lambda p: osp.relpath(p, REPO))
def test_every_relative_link_and_anchor_resolves(page):
    with open(page) as f:
        text = FENCE.sub('', f.read())
    broken = []
    for target in LINK.findall(text):
        if re.match(r'[a-z]+:', target):
            continue  # http(s), mailto
        path, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(osp.dirname(page), path)) if path else page
        if not osp.exists(resolved):
            broken.append(f'{target}: no {osp.relpath(resolved, REPO)}')
        elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
            broken.append(f'{target}: no heading #{anchor} in {osp.relpath(resolved, REPO)}')
    assert not broken, broken


@pytest.mark.parametrize('page', PAGES, ids=lambda p: osp.relpath(p, REPO))
def test_no_page_names_a_path_outside_the_repository_or_an_issue(page):
    with open(page) as f:
        text = f.read()
    outside = re.findall(r'(?:\.\./)?shared/[\w./-]*|\breference/\w+\.md|\bseeds/\w+', text)
    assert not outside, outside
    # an upstream repository's issue is a public source ('qhfan/RMT GitHub issue 21'); the tracker's are not
    assert not re.findall(r'(?<!GitHub )\bissue \d+\b(?! of )', text, re.I), 'name the change, not the issue'


def test_the_mmcv_build_time_is_stated_once():
    stated = []
    for page in PAGES:
        with open(page) as f:
            for line in f:
                if re.search(r'\d+(-\d+)? min', line) and 'mmcv' in line and 'build' in line:
                    stated.append(osp.relpath(page, REPO))
    assert stated == ['docs/getting_started.md'], stated


def _launches(text: str):
    """Each ``dist_train.sh`` / ``slurm_train.sh`` command of a page: (the command, the GPUs it trains on)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r'(?:NNODES=(\d+)\S*\s+(?:\S+=\S+\s+)*)?(?:GPUS=(\d+)\s+)?bash tools/(dist|slurm)_train\.sh'
                          r'\s+([^`#]*)', line)
        if not match:
            continue
        command = match.group(0)
        if (line.count('`') % 2 or line.rstrip().endswith('\\')) and i + 1 < len(lines):
            command += ' ' + lines[i + 1].split('`')[0]  # a command that goes on on the next line
        args = command.split(f'{match.group(3)}_train.sh', 1)[1].split()
        if match.group(3) == 'dist':
            gpus = int(args[1]) * int(match.group(1) or 1)
        else:
            gpus = int(match.group(2) or 8)
        yield command, gpus


def test_every_launch_on_other_than_8_gpus_scales_the_lr():
    """Every recipe's learning rate belongs to 8 GPUs x its per-GPU batch: a documented command on another number
    of GPUs carries --auto-scale-lr (the demo's own schedule aside)."""
    wrong, seen = [], 0
    for page in PAGES:
        with open(page) as f:
            for command, gpus in _launches(f.read()):
                seen += 1
                if gpus != 8 and '--demo' not in command and '--auto-scale-lr' not in command:
                    wrong.append(f'{osp.relpath(page, REPO)}: {command.strip()} ({gpus} GPUs)')
    assert seen >= 5 and not wrong, wrong


def test_the_demo_figures_on_the_pages_are_the_recorded_run():
    """README.md and docs/getting_started.md state the figures of one ``make demo`` run, which
    ``tools/misc/record_demo.py`` wrote into docs/demo_run.json with its version, commit, date and machine: the
    getting-started block is that file rendered, and every figure the README's quick start states is one of it."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location('record_demo', osp.join(REPO, 'tools', 'misc', 'record_demo.py'))
    record_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record_demo)
    with open(osp.join(REPO, 'docs', 'demo_run.json')) as f:
        record = json.load(f)
    assert record['version'] and record['commit'] and record['date'] and record['machine']['cpu']
    with open(osp.join(REPO, 'docs', 'getting_started.md')) as f:
        page = f.read()
    block = page.split(f'<!-- {record_demo.MARKER}: begin -->', 1)[1].split(f'<!-- {record_demo.MARKER}: end -->', 1)[0]
    assert block == f'\n{record_demo.markdown(record)}\n', \
        'run python tools/misc/record_demo.py --markdown docs/getting_started.md'
    held = set()
    for stage in ('pretrain', 'detection'):
        for when in ('first', 'last'):
            for name, value in record[stage][when]['metrics'].items():
                held |= {f'{value:.3f}', f'{value:.4f}', f'{value:.1f}%'}
    with open(osp.join(REPO, 'README.md')) as f:
        readme = f.read()
    quick_start = readme.split('## Quick start', 1)[1].split('\n## ', 1)[0]
    stated = re.findall(r'(?<![\d.])(?:0\.\d{3,4}|\d{1,2}\.\d%)(?![\d])', quick_start)
    assert {'0.077', '0.097', '0.0770', '0.0970'} & set(stated), stated
    assert set(stated) <= held | {'0.03'}, sorted(set(stated) - held)
    # the curves' caption dates the same run
    assert f"Run of {record['date']} (mmvisatt {record['version']} at {record['commit']})" in quick_start
