"""Write ``docs/demo_run.json``: the figures of one ``make demo`` run with what gave them.

    python tools/misc/record_demo.py                       # after make demo: work_dirs/demo_imagenet, work_dirs/demo
    python tools/misc/record_demo.py --work-dirs A B --out docs/demo_run.json --markdown docs/getting_started.md

Per stage (the ImageNet pre-training, the detection training): the first and the last evaluation the run wrote
(``eval_progress.json``), the iterations and the minutes between the first and the last line of its log; and the
run's mmvisatt version, the commit of the checkout it ran from, the date and the machine (CPU model, cores,
memory, torch). ``--markdown`` rewrites the block between ``<!-- demo-run: begin -->`` and ``<!-- demo-run: end -->``
of a page from the record (docs/getting_started.md has it). README.md and docs/getting_started.md state these
figures; ``tests/test_docs.py`` fails when they state one the file does not hold.
"""
import argparse
import datetime
import glob
import json
import os
import os.path as osp
import platform
import re
import subprocess
import sys
from typing import Dict, Optional

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))
from benchmark import write_between_markers  # noqa: E402  (tools/analysis)

STAMP = re.compile(r'^(\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}) - ')


def _cpu_model() -> str:
    """The CPU's model name, with its clock where the name leaves it out (some virtual machines do)."""
    name, mhz = None, None
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name' and name is None:
                    name = value.strip()
                elif key.strip() == 'cpu MHz' and mhz is None:
                    mhz = float(value)
    except (OSError, ValueError):
        pass
    name = name or platform.processor() or platform.machine()
    if mhz and 'Hz' not in name:
        name += f' @ {mhz / 1000:.2f}GHz'
    return name


def machine() -> Dict[str, object]:
    """The hardware and software that ran the demo."""
    import torch
    memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    return dict(cpu=_cpu_model(), cores=len(os.sched_getaffinity(0)), memory_gib=round(memory),
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                platform=platform.platform(), python=platform.python_version(), torch=torch.__version__)


def _minutes(work_dir: str) -> Optional[float]:
    """Minutes from the first to the last time-stamped line of the run's newest log."""
    logs = sorted(glob.glob(osp.join(work_dir, '*', '*.log')))
    if not logs:
        return None
    stamps = [STAMP.match(line) for line in open(logs[-1], errors='replace')]
    stamps = [datetime.datetime.strptime(m.group(1), '%Y/%m/%d %H:%M:%S') for m in stamps if m]
    return round((stamps[-1] - stamps[0]).total_seconds() / 60, 1) if len(stamps) > 1 else None


def stage(work_dir: str) -> Dict[str, object]:
    path = osp.join(work_dir, 'eval_progress.json')
    if not osp.isfile(path):
        raise SystemExit(f'{path} is missing: run make demo first (the demo writes it after its last evaluation)')
    with open(path) as f:
        progress = json.load(f)
    return dict(work_dir=osp.basename(osp.normpath(work_dir)), first=progress['first'], last=progress['last'],
                minutes=_minutes(work_dir),
                date=datetime.datetime.fromtimestamp(osp.getmtime(path), datetime.timezone.utc).date().isoformat())


MARKER = 'demo-run'


def markdown(record: dict) -> str:
    """The page's block (between the demo-run markers): what ran where, and each stage's first and last
    evaluation."""
    m, pre, det = record['machine'], record['pretrain'], record['detection']
    top1 = [pre[k]['metrics']['accuracy/top1'] for k in ('first', 'last')]

    def coco(kind: str, when: str) -> str:
        metrics = det[when]['metrics']
        value = f"{metrics[f'coco/{kind}_mAP']:.3f}"
        return value + (f" (AP50 {metrics[f'coco/{kind}_mAP_50']:.3f})" if when == 'last' else '')

    return '\n'.join([
        "<!-- written by tools/misc/record_demo.py from docs/demo_run.json -->",
        f"The `{record['command']}` run of {record['date']} (mmvisatt {record['version']} at {record['commit']}; "
        f"{m['cores']} cores of an {m['cpu']}, {m['memory_gib']} GiB, torch {m['torch']}), as "
        '`docs/demo_run.json` records it (each stage\'s minutes run from its first to its last log line, the '
        'evaluations and start-up included):', '',
        f"| stage 1: pre-training ({pre['minutes']} min, {pre['last']['iter']} iterations) | top-1 accuracy (150 "
        'held-out images) |',
        '|---|---|',
        f"| iteration {pre['first']['iter']} | {top1[0]:.1f}% |",
        f"| end of pre-training (iteration {pre['last']['iter']}) | {top1[1]:.1f}% |", '',
        f"| stage 2: detection from stage 1 ({det['minutes']} min, {det['last']['iter']} iterations) | bbox mAP | "
        'segm mAP |',
        '|---|---|---|',
        f"| iteration {det['first']['iter']} | {coco('bbox', 'first')} | {coco('segm', 'first')} |",
        f"| end of training (iteration {det['last']['iter']}) | {coco('bbox', 'last')} | {coco('segm', 'last')} |"])


def _commit(path: str) -> Optional[str]:
    run = subprocess.run(['git', '-C', path, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True)
    return run.stdout.strip() or None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dirs', nargs=2, metavar=('PRETRAIN', 'DETECTION'),
                        default=[osp.join('work_dirs', 'demo_imagenet'), osp.join('work_dirs', 'demo')])
    parser.add_argument('--out', default=osp.join(ROOT, 'docs', 'demo_run.json'))
    parser.add_argument('--markdown', metavar='PAGE', help='rewrite the demo-run block of this page')
    args = parser.parse_args(argv)
    from mmvisatt.version import __version__
    pretrain, detection = (stage(d) for d in args.work_dirs)
    record = dict(command='make demo', version=__version__, commit=_commit(args.work_dirs[1]),
                  date=detection['date'], machine=machine(), pretrain=pretrain, detection=detection)
    with open(args.out, 'w') as f:
        json.dump(record, f, indent=1)
        f.write('\n')
    print(f'wrote {args.out}')
    if args.markdown:
        try:
            write_between_markers(args.markdown, MARKER, markdown(record))
        except ValueError as error:
            raise SystemExit(str(error))
        print(f'wrote {args.markdown}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
