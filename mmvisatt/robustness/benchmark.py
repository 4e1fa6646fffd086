"""Corruption robustness of a detector or segmentor: its test loop on clean and corrupted validation images.

For every corruption ``c`` and severity ``s`` the config's test set is evaluated with ``CorruptImage(c, s)`` inserted
right after ``LoadImageFromFile``, with the checkpoint given. The summary follows the COCO-C benchmark
(Michaelis et al. 2019, eq. 1-2), for each metric ``P`` (bbox/segm mAP, mIoU, ...):

- ``P_clean``: the metric on the clean images;
- per corruption: ``mean_s P_{c,s}``;
- ``mPC = 1/N_c sum_c 1/N_s sum_s P_{c,s}`` (mean performance under corruption);
- ``rPC = mPC / P_clean`` (relative performance under corruption).

The test config is prepared exactly as ``tools/test.py`` prepares it (:func:`mmvisatt.engine.prepare_test`, so
``--demo`` and ``--cfg-options`` mean the same) and each run is an mmengine ``Runner.test()``.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import os.path as osp
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from mmengine.config import Config
from mmengine.logging import print_log

from mmvisatt.datasets.transforms import IMAGE_LOADERS
from mmvisatt.engine.entrypoints import build_runner, import_task_library, prepare_test, setup_distributed

from .corruptions import CORRUPTION_GROUPS, CORRUPTIONS, SEVERITIES, check_corruption

# Metrics summarised when --metrics is not given, matched on the last component of the key
# ('coco/bbox_mAP' -> 'bbox_mAP').
DEFAULT_METRICS = ('bbox_mAP', 'segm_mAP', 'mIoU')
RESULT_NAME = 'corruption_benchmark'
# ours, and mmdet's seedless BGR-as-RGB transform of the same corruptions
_CORRUPTING = ('CorruptImage', 'Corrupt', 'mmdet.Corrupt')

Scores = Dict[str, float]


# ----------------------------------------------------------------------------------------------- config editing

def _pipelines(dataset: Any) -> Iterable[list]:
    """Every ``pipeline`` list of a dataset config, looking inside wrappers (``dataset=`` / ``datasets=``)."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('pipeline'), list):
        yield dataset['pipeline']
    yield from _pipelines(dataset.get('dataset'))
    for inner in dataset.get('datasets') or []:
        yield from _pipelines(inner)


def _is_loader(step: Any) -> bool:
    return isinstance(step, dict) and isinstance(step.get('type'), str) and \
        step['type'].split('.')[-1] in IMAGE_LOADERS


def insert_corruption(cfg: Config, corruption: str, severity: int, seed: Optional[int] = 0) -> int:
    """Insert ``CorruptImage(corruption, severity)`` after ``LoadImageFromFile`` in every test pipeline of ``cfg``.

    Returns how many pipelines were changed; raises a ``ValueError`` when none has a ``LoadImageFromFile`` or a
    pipeline is corrupted already.
    """
    check_corruption(corruption, severity)
    changed = 0
    for pipeline in _pipelines(cfg.test_dataloader.get('dataset')):
        present = [step['type'] for step in pipeline if isinstance(step, dict) and step.get('type') in _CORRUPTING]
        if present:
            raise ValueError(f'the test pipeline already has a {present[0]} transform; the benchmark adds its own, '
                             'remove it from the config')
        index = next((i for i, step in enumerate(pipeline) if _is_loader(step)), None)
        if index is not None:
            pipeline.insert(index + 1, dict(type='CorruptImage', corruption=corruption, severity=int(severity),
                                            seed=seed))
            changed += 1
    if not changed:
        raise ValueError('no LoadImageFromFile found in test_dataloader.dataset.pipeline: the corruptions are applied '
                         'to the loaded image, so the test pipeline must load images with LoadImageFromFile')
    imports = dict(cfg.get('custom_imports') or dict(imports=[], allow_failed_imports=False))
    if 'mmvisatt.robustness' not in imports['imports']:
        # so the config the Runner saves in the work dir runs again by itself (tools/test.py)
        imports['imports'] = list(imports['imports']) + ['mmvisatt.robustness']
        cfg.custom_imports = imports
    return changed


# ----------------------------------------------------------------------------------------------- metrics

def select_metrics(scores: Mapping[str, Any], requested: Optional[Sequence[str]] = None) -> List[str]:
    """The metric keys to summarise: ``requested`` (all must exist) or those ending in :data:`DEFAULT_METRICS`."""
    available = sorted(k for k, v in scores.items() if isinstance(v, (int, float)))
    if requested:
        missing = [k for k in requested if k not in available]
        if missing:
            raise ValueError(f'--metrics {" ".join(missing)}: not computed by the test evaluator; '
                             f'available: {", ".join(available)}')
        return list(requested)
    chosen = [k for k in available if k.split('/')[-1] in DEFAULT_METRICS]
    if not chosen:
        raise ValueError(f'none of {", ".join(DEFAULT_METRICS)} in the test metrics ({", ".join(available)}); '
                         'name the ones to summarise with --metrics')
    return chosen


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def summarize(clean: Mapping[str, float], corrupted: Mapping[str, Mapping[int, Mapping[str, float]]],
              metrics: Sequence[str]) -> Dict[str, Any]:
    """The COCO-C summary of one benchmark.

    Args:
        clean: metric -> value on clean images.
        corrupted: corruption -> severity -> metric -> value.
        metrics: the metric keys to summarise.

    Returns:
        ``clean``, ``corrupted`` (restricted to ``metrics``), ``per_corruption`` (corruption -> metric -> mean over
        severities), ``mPC`` and ``rPC`` (metric -> value; ``rPC`` is None where the clean value is 0).
    """
    if not corrupted:
        raise ValueError('no corrupted results to summarise')
    table = {c: {int(s): {m: float(r[m]) for m in metrics} for s, r in sorted(by_sev.items())}
             for c, by_sev in corrupted.items()}
    if any(not by_sev for by_sev in table.values()):
        raise ValueError('every corruption needs at least one severity')
    per_corruption = {c: {m: _mean([r[m] for r in by_sev.values()]) for m in metrics} for c, by_sev in table.items()}
    mpc = {m: _mean([per_corruption[c][m] for c in table]) for m in metrics}
    rpc = {m: (mpc[m] / float(clean[m]) if float(clean[m]) != 0 else None) for m in metrics}
    return dict(metrics=list(metrics), clean={m: float(clean[m]) for m in metrics}, corrupted=table,
                per_corruption=per_corruption, mPC=mpc, rPC=rpc)


# ----------------------------------------------------------------------------------------------- reports

def _fmt(value: Optional[float]) -> str:
    if value is None or not math.isfinite(value):
        return 'n/a'
    return f'{value:.3f}' if abs(value) <= 1 else f'{value:.2f}'


def _group_of(corruption: str) -> str:
    return next((g for g, names in CORRUPTION_GROUPS.items() if corruption in names), '')


def markdown_table(summary: Mapping[str, Any]) -> str:
    """One table per metric: corruptions by severity with their mean, then clean, mPC and rPC."""
    severities = sorted({s for by_sev in summary['corrupted'].values() for s in by_sev})
    lines: List[str] = []
    for metric in summary['metrics']:
        lines += [f'### {metric}', '',
                  '| corruption | group | ' + ' | '.join(f'severity {s}' for s in severities) + ' | mean |',
                  '|---|---|' + '---:|' * (len(severities) + 1)]
        lines.append('| clean | | ' + ' | '.join('' for _ in severities) + f' | {_fmt(summary["clean"][metric])} |')
        for corruption, by_sev in summary['corrupted'].items():
            cells = [_fmt(by_sev[s][metric]) if s in by_sev else '' for s in severities]
            lines.append(f'| {corruption} | {_group_of(corruption)} | ' + ' | '.join(cells) +
                         f' | {_fmt(summary["per_corruption"][corruption][metric])} |')
        rpc = summary['rPC'][metric]
        lines += ['', f'mPC {_fmt(summary["mPC"][metric])}, clean {_fmt(summary["clean"][metric])}, rPC '
                  + ('n/a (clean is 0)' if rpc is None else f'{100 * rpc:.1f}%'), '']
    return '\n'.join(lines)


def plot_summary(summary: Mapping[str, Any], path: str) -> str:
    """Metric against severity (0 = clean), one line per corruption and a dashed line at mPC; one panel per
    metric. Drawn on matplotlib's Agg canvas directly, so no display or pyplot backend is involved."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = summary['metrics']
    fig = Figure(figsize=(6.5 * len(metrics) + 2.5, 4.5), dpi=100)
    colours = colormaps['tab20']
    styles = {'noise': '-', 'blur': '--', 'weather': '-.', 'digital': ':'}
    for k, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), k + 1)
        for i, (corruption, by_sev) in enumerate(summary['corrupted'].items()):
            xs = [0] + sorted(by_sev)
            ys = [summary['clean'][metric]] + [by_sev[s][metric] for s in sorted(by_sev)]
            ax.plot(xs, ys, marker='o', markersize=3, color=colours(i % 20),
                    linestyle=styles.get(_group_of(corruption), '-'), label=corruption)
        ax.axhline(summary['mPC'][metric], color='k', linestyle='--', linewidth=1, label='mPC')
        ax.set_xticks(range(0, 6))
        ax.set_xticklabels(['clean', '1', '2', '3', '4', '5'])
        ax.set_xlabel('severity')
        ax.set_ylabel(metric)
        rpc = summary['rPC'][metric]
        ax.set_title(f'mPC {_fmt(summary["mPC"][metric])}, rPC ' + ('n/a' if rpc is None else f'{100 * rpc:.1f}%'),
                     fontsize=9)
        ax.grid(alpha=0.3)
    fig.axes[-1].legend(loc='center left', bbox_to_anchor=(1.02, 0.5), fontsize=7)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format='png')
    return path


def _jsonable(value: Any) -> Any:
    """Non-finite numbers become null (JSON has no NaN); severity keys become strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_reports(summary: Mapping[str, Any], out_dir: str) -> Dict[str, str]:
    """``corruption_benchmark.{json,md,png}`` in ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: osp.join(out_dir, f'{RESULT_NAME}.{ext}') for ext in ('json', 'md', 'png')}
    with open(paths['json'], 'w') as f:
        json.dump(_jsonable(summary), f, indent=1)
    with open(paths['md'], 'w') as f:
        f.write(f'# Corruption benchmark: {osp.basename(summary.get("config", ""))}\n\n')
        f.write(markdown_table(summary) + '\n')
    plot_summary(summary, paths['png'])
    return paths


# ----------------------------------------------------------------------------------------------- running

def resolve_corruptions(names: Optional[Sequence[str]]) -> List[str]:
    """Corruption names, group names (noise, blur, weather, digital) or ``all``, expanded in benchmark order."""
    if not names:
        return list(CORRUPTIONS)
    chosen: List[str] = []
    for name in names:
        group = CORRUPTIONS if name == 'all' else CORRUPTION_GROUPS.get(name, (name,))
        for corruption in group:
            if corruption not in CORRUPTIONS:
                raise ValueError(f'unknown corruption {corruption!r}; choose from {", ".join(CORRUPTIONS)}, '
                                 f'a group ({", ".join(CORRUPTION_GROUPS)}) or all')
            if corruption not in chosen:
                chosen.append(corruption)
    return chosen


def resolve_severities(severities: Optional[Sequence[int]]) -> List[int]:
    chosen = sorted(set(severities or SEVERITIES))
    for s in chosen:
        check_corruption(CORRUPTIONS[0], s)
    return chosen


def _numbers(scores: Mapping[str, Any]) -> Scores:
    return {k: float(v) for k, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _config_sha1(cfg: Config) -> str:
    """A fingerprint of the final test config (after --demo and --cfg-options, before the per-run work dir)."""
    text = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()


def _file_stamp(path: str) -> Optional[List[float]]:
    """Size and modification time, so a checkpoint overwritten in place is not mistaken for the old one."""
    if not osp.isfile(path):
        return None
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime]


def _run(base_cfg: Config, scope: str, name: str, settings: dict, out_dir: str,
         corruption: Optional[Tuple[str, int, Optional[int]]] = None) -> Scores:
    """One ``Runner.test()``; its metrics are kept in ``runs/<name>/metrics.json`` and reused by a later
    benchmark with the same settings (a full benchmark is 76 runs over the test set)."""
    run_dir = osp.join(out_dir, 'runs', name)
    record = osp.join(run_dir, 'metrics.json')
    if osp.isfile(record):
        with open(record) as f:
            saved = json.load(f)
        if saved.get('settings') == settings:
            print_log(f'corruption benchmark: {name}: reusing {record}', logger='current')
            return saved['metrics']
    cfg = copy.deepcopy(base_cfg)
    if corruption is not None:
        insert_corruption(cfg, *corruption)
    cfg.work_dir = run_dir
    # mmengine keeps loggers, visualizers and default scopes as named global instances, and hands back an
    # existing one (with the first run's work dir) when a name repeats: one name per run
    cfg.experiment_name = f'{RESULT_NAME}_{name}_{time.strftime("%Y%m%d_%H%M%S")}'
    if isinstance(cfg.get('visualizer'), dict):
        cfg.visualizer.name = cfg.experiment_name
    runner = build_runner(cfg, scope)
    scores = _numbers(runner.test())
    with open(record, 'w') as f:
        json.dump(_jsonable(dict(settings=settings, metrics=scores)), f, indent=1)
    return scores


def run_benchmark(config: str, checkpoint: str, corruptions: Optional[Sequence[str]] = None,
                  severities: Optional[Sequence[int]] = None, demo: bool = False, out_dir: Optional[str] = None,
                  cfg_options: Optional[Sequence[str]] = None, metrics: Optional[Sequence[str]] = None,
                  seed: Optional[int] = 0) -> Dict[str, Any]:
    """Evaluate ``checkpoint`` on clean and corrupted test images of ``config``; write and return the summary.

    ``cfg_options`` are ``KEY=VALUE`` strings as for ``tools/test.py --cfg-options``. The summary (see
    :func:`summarize`) also holds every metric of every run under ``raw`` and the paths of the reports.
    """
    corruptions = resolve_corruptions(corruptions)
    severities = resolve_severities(severities)
    if out_dir is None:
        name = osp.splitext(osp.basename(config))[0] + ('_demo' if demo else '')
        out_dir = osp.join('work_dirs', RESULT_NAME, name)
    argv = [config, checkpoint, '--work-dir', out_dir] + (['--demo'] if demo else [])
    if cfg_options:
        argv += ['--cfg-options', *cfg_options]
    cfg, _ = prepare_test(argv)
    scope = import_task_library(cfg)
    setup_distributed(cfg)

    settings = dict(config=osp.abspath(config), config_sha1=_config_sha1(cfg), checkpoint=osp.abspath(checkpoint),
                    checkpoint_stamp=_file_stamp(checkpoint))
    raw: Dict[str, Scores] = {'clean': _run(cfg, scope, 'clean', settings, out_dir)}
    keys = select_metrics(raw['clean'], metrics)
    corrupted: Dict[str, Dict[int, Scores]] = {}
    for corruption in corruptions:
        for severity in severities:
            name = f'{corruption}_{severity}'
            print_log(f'corruption benchmark: {name} ({len(raw)}/{len(corruptions) * len(severities)})',
                      logger='current')
            raw[name] = _run(cfg, scope, name, dict(settings, corruption=corruption, severity=severity, seed=seed),
                             out_dir, (corruption, severity, seed))
            corrupted.setdefault(corruption, {})[severity] = raw[name]
    summary = summarize(raw['clean'], corrupted, keys)
    summary.update(config=config, checkpoint=checkpoint, demo=bool(demo), seed=seed, corruptions=corruptions,
                   severities=severities, raw=raw)
    summary['reports'] = write_reports(summary, out_dir)
    print_log('corruption benchmark:\n' + markdown_table(summary) + '\nreports: ' +
              ', '.join(summary['reports'].values()), logger='current')
    return summary


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Corruption robustness (COCO-C / ImageNet-C protocol): evaluate a checkpoint on clean and '
        'corrupted test images; report per-corruption metrics, mPC and rPC')
    parser.add_argument('config', help='detection or segmentation config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--corruptions', nargs='+', metavar='NAME',
                        help=f'corruptions, groups ({", ".join(CORRUPTION_GROUPS)}) or all (default: all 15: '
                        f'{", ".join(CORRUPTIONS)})')
    parser.add_argument('--severities', nargs='+', type=int, choices=SEVERITIES, metavar='S',
                        help='severities 1-5 (default: all)')
    parser.add_argument('--metrics', nargs='+', metavar='KEY',
                        help='metric keys to summarise (default: those ending in bbox_mAP, segm_mAP or mIoU)')
    parser.add_argument('--seed', type=int, default=0,
                        help='base seed of the random corruptions, combined with each file name (default: 0)')
    parser.add_argument('--demo', action='store_true', help='run on the generated demo data, as tools/test.py --demo')
    parser.add_argument('--out-dir', help='where the reports and the per-run work dirs go (default: '
                        'work_dirs/corruption_benchmark/<config name>[_demo])')
    parser.add_argument('--cfg-options', nargs='+', metavar='KEY=VALUE',
                        help='override config settings, as for tools/test.py (applied after --demo)')
    args = parser.parse_args(argv)
    try:
        resolve_corruptions(args.corruptions)
    except ValueError as error:
        parser.error(f'--corruptions: {error}')
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    return run_benchmark(args.config, args.checkpoint, corruptions=args.corruptions, severities=args.severities,
                         demo=args.demo, out_dir=args.out_dir, cfg_options=args.cfg_options, metrics=args.metrics,
                         seed=args.seed)
