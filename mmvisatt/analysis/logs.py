"""Training curves from an mmengine work dir: losses against iteration and validation metrics against the
iteration they were measured at, as a PNG.

mmengine's ``LocalVisBackend`` writes every logged scalar to ``WORK_DIR/<timestamp>/vis_data/scalars.json`` (and
the same lines to ``<timestamp>.json`` beside it), one JSON object per line: training lines carry ``iter``,
``lr`` and the losses; validation lines carry the metrics. A validation line's ``step`` is the epoch when
``LoggerHook(log_metric_by_epoch=True)`` (mmengine's default, so it stays 0 throughout an iteration-based run such
as ``--demo``); the iteration of a validation is therefore taken as the larger of its ``step`` and the last
training iteration logged before it, which is exact for both settings whenever the logging interval divides the
validation interval.

Every run of a work dir (a resumed or restarted training adds a ``<timestamp>`` folder) is read in time order; where
a later run covers iterations an earlier one had logged, the later run's values are kept.
"""
import argparse
import fnmatch
import json
import os
import os.path as osp
import sys
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Points = List[Tuple[int, float]]

# logged alongside the losses and metrics; never plotted unless asked for
_BOOKKEEPING = ('iter', 'step', 'epoch')
_TIMING = ('time', 'data_time', 'memory', 'eta')


class LogError(ValueError):
    """A work dir without readable training logs, or a key that is not in them (the message says which)."""


@dataclass
class TrainingLog:
    """Scalars of a training run: ``train[key]`` and ``val[key]`` are ``(iteration, value)`` in iteration order."""
    train: Dict[str, Points] = field(default_factory=dict)
    val: Dict[str, Points] = field(default_factory=dict)
    sources: List[str] = field(default_factory=list)


def find_scalar_files(path: str) -> List[str]:
    """The scalar logs of ``path`` in time order: a work dir (every ``<timestamp>/vis_data``), one run's folder,
    its ``vis_data`` folder, or a ``scalars.json`` / ``<timestamp>.json`` file."""
    if not osp.exists(path):
        raise FileNotFoundError(f'work dir not found: {path}')
    if osp.isfile(path):
        return [path]
    if osp.basename(osp.normpath(path)) == 'vis_data':
        runs = [osp.dirname(osp.normpath(path))]
    elif osp.isdir(osp.join(path, 'vis_data')):
        runs = [path]
    else:
        # run folders are named by their start time (YYYYMMDD_HHMMSS), so name order is time order
        runs = [osp.join(path, name) for name in sorted(os.listdir(path))
                if osp.isdir(osp.join(path, name, 'vis_data'))]
    files = []
    for run in runs:
        for name in ('scalars.json', f'{osp.basename(osp.normpath(run))}.json'):
            candidate = osp.join(run, 'vis_data', name)
            if osp.isfile(candidate):
                files.append(candidate)
                break
    if not files and runs:
        raise LogError(f'nothing logged yet under {path} ({len(runs)} run folder(s) without scalars.json): '
                       'training scalars are written every default_hooks.logger.interval iterations')
    if not files:
        raise LogError(f'no training logs under {path}: mmengine writes them to {osp.join(path, "<timestamp>")}'
                       '/vis_data/scalars.json when LocalVisBackend is among the config\'s vis_backends (the '
                       'default). Is it the --work-dir of a training run?')
    return files


def read_scalars(path: str) -> List[dict]:
    """The JSON objects of one scalar log, in file order. A cut-off last line (a run killed while writing) is
    skipped with a warning; any other unreadable line raises :class:`LogError`."""
    with open(path) as f:
        lines = [(i + 1, line.strip()) for i, line in enumerate(f) if line.strip()]
    records = []
    for number, line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == lines[-1][0]:
                warnings.warn(f'{path}:{number}: skipping a truncated last line')
                continue
            raise LogError(f'{path}:{number} is not a JSON object ({error})') from None
    return records


def _is_train(record: dict) -> bool:
    return 'iter' in record or any(key.endswith('lr') or key.startswith('train/') for key in record)


def split_records(records: Sequence[dict]) -> Tuple[Dict[str, Points], Dict[str, Points]]:
    """``(train, val)`` series of one run's records; see the module docstring for the iteration of a validation."""
    train: Dict[str, Points] = {}
    val: Dict[str, Points] = {}
    last_iter = 0
    for record in records:
        if _is_train(record):
            last_iter = int(record.get('iter', record.get('step', last_iter)))
            iteration, target = last_iter, train
        else:
            iteration, target = max(int(record.get('step', 0)), last_iter), val
        for key, value in record.items():
            if key in _BOOKKEEPING or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            target.setdefault(key, []).append((iteration, float(value)))
    return train, val


def _merge(old: Dict[str, Points], new: Dict[str, Points], start: int) -> None:
    """Add a later run's series; the earlier run's points from ``start`` on were redone by it."""
    for key in old:
        old[key] = [p for p in old[key] if p[0] < start]
    for key, points in new.items():
        old.setdefault(key, []).extend(points)


def load_training_log(path: str) -> TrainingLog:
    """Every scalar of the work dir (or run folder / log file) ``path``."""
    log = TrainingLog()
    for source in find_scalar_files(path):
        train, val = split_records(read_scalars(source))
        firsts = [points[0][0] for points in list(train.values()) + list(val.values()) if points]
        if not firsts:
            continue
        start = min(firsts)
        _merge(log.train, train, start)
        _merge(log.val, val, start)
        log.sources.append(source)
    if not log.sources:
        raise LogError(f'the training logs under {path} hold no scalars yet (nothing logged before the run ended?)')
    return log


def default_keys(log: TrainingLog) -> Tuple[List[str], List[str]]:
    """Every training loss and every validation metric that was measured: a metric that is -1 throughout is left
    out (COCO's mark for "no objects of this size")."""
    train = [k for k in log.train if 'loss' in k]
    val = [k for k, points in log.val.items()
           if k.split('/')[-1] not in _TIMING and any(value != -1 for _, value in points)]
    return train, val


def select_keys(log: TrainingLog, keys: Optional[Sequence[str]]) -> Tuple[List[str], List[str]]:
    """``(train keys, val keys)`` named by ``keys``: a full key (``coco/bbox_mAP``), its last part (``bbox_mAP``)
    or a glob (``loss_*``); a key logged in both phases (``time``) is plotted for both."""
    if not keys:
        return default_keys(log)
    train: List[str] = []
    val: List[str] = []
    for pattern in keys:
        found = False
        for logged, chosen in ((log.train, train), (log.val, val)):
            for key in logged:
                if key == pattern or key.split('/')[-1] == pattern or fnmatch.fnmatchcase(key, pattern):
                    found = True
                    if key not in chosen:
                        chosen.append(key)
        if not found:
            raise LogError(f'key {pattern!r} is not in the logs; training keys: {", ".join(log.train) or "none"}; '
                           f'validation keys: {", ".join(log.val) or "none"}')
    return train, val


def plot_training_log(log: TrainingLog, path: str, keys: Optional[Sequence[str]] = None,
                      title: Optional[str] = None) -> str:
    """Write the curves of ``keys`` (default: :func:`default_keys`) to the PNG ``path``; returns ``path``.

    Panels share the iteration axis: the training losses together, every other training key on its own (their
    scales differ), then the validation metrics together (with markers: validations are few).
    """
    train, val = select_keys(log, keys)
    losses = [k for k in train if 'loss' in k]
    panels = ([('training', losses)] if losses else []) + [('training', [k]) for k in train if k not in losses]
    if val:
        panels.append(('validation', val))
    if not panels:
        raise LogError('nothing to plot: the logs have no training losses or validation metrics; pass --keys '
                       f'(training keys: {", ".join(log.train) or "none"})')
    fig = Figure(figsize=(8, 2.2 + 2.3 * len(panels)), dpi=100)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (phase, panel_keys) in zip(axes, panels):
        series = log.train if phase == 'training' else log.val
        colors = colormaps['tab10'].colors
        for i, key in enumerate(panel_keys):
            xs, ys = zip(*series[key])
            few = phase == 'validation' or len(xs) <= 30
            ax.plot(xs, ys, label=key, color=colors[i % len(colors)], linewidth=1.2, marker='o' if few else None,
                    markersize=3)
        ax.set_ylabel(panel_keys[0] if len(panel_keys) == 1 else ('loss' if phase == 'training' else 'metric'))
        ax.set_title(phase, fontsize=9, loc='left')
        ax.grid(True, color='0.9')
        ax.legend(fontsize=7, loc='best', ncol=2 if len(panel_keys) > 6 else 1)
    axes[-1].set_xlabel('iteration')
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=fig.dpi, format='png')
    return path


def summarize_log(log: TrainingLog) -> str:
    """Lines naming every logged key, its number of points and its last value."""
    lines = []
    for phase, series in (('training', log.train), ('validation', log.val)):
        for key, points in series.items():
            lines.append(f'{phase:10s} {key}: {len(points)} points, last {points[-1][1]:.4g} '
                         f'(iteration {points[-1][0]})')
    return '\n'.join(lines)


def plot_logs_main(argv: Optional[Sequence[str]] = None) -> str:
    """``tools/analysis/plot_logs.py``; returns the PNG path."""
    parser = argparse.ArgumentParser(description='Plot training losses and validation metrics of an mmengine work '
                                                 'dir (its <timestamp>/vis_data/scalars.json logs) as a PNG')
    parser.add_argument('work_dir', metavar='WORK_DIR',
                        help='the --work-dir of a training run (or one run folder, or a scalars.json file)')
    parser.add_argument('--keys', nargs='+', metavar='KEY',
                        help='what to plot: full keys (coco/bbox_mAP), their last part (bbox_mAP, mIoU) or globs '
                             '(loss_*); default: every training loss and every validation metric')
    parser.add_argument('--out', help='PNG file to write (default: WORK_DIR/training_curves.png)')
    parser.add_argument('--title', help='figure title (default: the work dir)')
    args = parser.parse_args(argv)
    log = load_training_log(args.work_dir)
    base = args.work_dir if osp.isdir(args.work_dir) else osp.dirname(args.work_dir)
    out = plot_training_log(log, args.out or osp.join(base, 'training_curves.png'), keys=args.keys,
                            title=args.title or osp.basename(osp.abspath(base)))
    print(summarize_log(log))
    print(f'read {", ".join(log.sources)}\nwrote {out}')
    return out


def run_plot_logs(argv: Optional[Sequence[str]] = None) -> None:
    """Run :func:`plot_logs_main`; a missing or empty work dir or an unknown key ends it with its message."""
    try:
        plot_logs_main(argv)
    except (LogError, FileNotFoundError) as error:
        sys.exit(f'error: {error}')
