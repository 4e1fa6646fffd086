"""Checks run before a Runner is built, so a missing dataset or checkpoint fails in a second with a message that
says what to do, instead of minutes later deep inside a dataloader worker or a weight initialiser."""
import os
import os.path as osp
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.config import Config

# dataset type -> (name, where to get it)
DATASET_SOURCES = {
    'CocoDataset': ('COCO 2017', 'https://cocodataset.org/#download (2017 Train/Val images and '
                                 '2017 Train/Val annotations)'),
    'ADE20KDataset': ('ADE20K', 'http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip'),
}


class MissingDataError(FileNotFoundError):
    """The dataset a config points at is not on disk."""


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint the config initialises from is not on disk."""


def leaf_datasets(dataset: Any) -> Iterator[dict]:
    """The real datasets inside wrappers such as ``RepeatDataset`` (``dataset``) or ``ConcatDataset``
    (``datasets``)."""
    if not isinstance(dataset, dict):
        return
    if 'dataset' in dataset:
        yield from leaf_datasets(dataset['dataset'])
    elif 'datasets' in dataset:
        for inner in dataset['datasets']:
            yield from leaf_datasets(inner)
    else:
        yield dataset


def _join(root: Optional[str], path: str) -> str:
    return path if root is None or osp.isabs(path) else osp.join(root, path)


def _needed_paths(dataset: dict) -> List[str]:
    """Directories and files a dataset reads: its annotation file and its data prefixes."""
    root = dataset.get('data_root')
    paths = [_join(root, dataset['ann_file'])] if dataset.get('ann_file') else []
    prefix = dataset.get('data_prefix') or {}
    # mmdet/mmseg: dict(img=..., seg_map_path=...); mmpretrain: a folder name
    paths += [_join(root, p) for p in (prefix.values() if isinstance(prefix, dict) else [prefix]) if p]
    return paths or ([root] if root else [])


def image_dir(dataset: dict) -> Optional[str]:
    """The folder a dataset reads its images from (mmdet ``data_prefix.img``, mmseg ``img_path``, an mmpretrain
    prefix string), under its ``data_root``; None when it names none."""
    root, prefix = dataset.get('data_root'), dataset.get('data_prefix') or {}
    folder = prefix.get('img', prefix.get('img_path')) if isinstance(prefix, dict) else prefix
    return _join(root, folder) if folder else root


def check_data(cfg: Config, loaders: Tuple[str, ...]) -> None:
    """Raise :class:`MissingDataError` if a dataset used by ``loaders`` (e.g. ``('train_dataloader',
    'val_dataloader')``) is missing, describing the expected layout and the ``--demo`` alternative."""
    datasets = [d for name in loaders for d in leaf_datasets((cfg.get(name) or {}).get('dataset'))]
    missing = [p for d in datasets for p in _needed_paths(d) if not osp.exists(p)]
    if not missing:
        for name in loaders:
            for dataset in leaf_datasets((cfg.get(name) or {}).get('dataset')):
                _check_class_folders(dataset, f'{name}.dataset')
        return
    kind = next((d['type'] for d in datasets if d.get('type') in DATASET_SOURCES), None)
    name, source = DATASET_SOURCES.get(kind, ('the dataset', None))
    roots = sorted({d['data_root'] for d in datasets if d.get('data_root')})
    layout = sorted({p for d in datasets for p in _needed_paths(d)})
    lines = [f'{name} not found: {missing[0]} does not exist (relative paths are relative to {osp.abspath(".")}).',
             f'The config expects {name} laid out as:']
    lines += [f'    {p}' for p in layout]
    if source:
        lines.append(f'Download it from {source}')
    if roots:
        lines.append(f'and unpack it there, or link an existing copy: ln -s /path/to/your/copy {roots[0].rstrip("/")}'
                     f'  (or point the config elsewhere with --cfg-options).')
    if not any(d.get('type') in _FOLDER_PER_CLASS for d in datasets):
        lines.append('To try the pipeline without it, add --demo: it trains and evaluates the same model on small '
                     'generated data.')
    raise MissingDataError('\n'.join(lines))


# mmpretrain datasets that, without an ann_file, take each sub-folder of the image folder as a class
_FOLDER_PER_CLASS = ('ImageNet', 'CustomDataset')


def _check_class_folders(dataset: dict, where: str) -> None:
    """An mmpretrain folder dataset without ``ann_file`` needs one sub-folder per class; images loose in the
    folder (ImageNet's val set as downloaded, say) make mmpretrain fail with a bare assertion."""
    folder = image_dir(dataset)
    if dataset.get('type') not in _FOLDER_PER_CLASS or dataset.get('ann_file') or not folder or \
            not osp.isdir(folder):
        return
    entries = os.listdir(folder)
    if any(osp.isdir(osp.join(folder, e)) for e in entries):
        return
    images = [e for e in entries if e.lower().endswith(('.jpeg', '.jpg', '.png', '.bmp', '.webp'))]
    raise MissingDataError(
        f'{folder} holds {len(images)} images but no class sub-folders: without an ann_file, {dataset["type"]} '
        f'reads <folder>/<class name>/<image>, one folder per class. Sort the images into class folders (for '
        f'ImageNet val, move each image into the folder of its synset, e.g. with the widely used valprep.sh), or '
        f'list them in an annotation file of "relative/path.JPEG label" lines and pass --cfg-options '
        f'{where}.ann_file=meta/<split>.txt.')


def pretrained_inits(node: Any, path: str = 'model') -> Iterator[Tuple[str, dict]]:
    """``(dotted path, init_cfg)`` of every ``Pretrained`` init in a model config."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        for item in init if isinstance(init, list) else [init]:
            if isinstance(item, dict) and item.get('type') == 'Pretrained':
                yield f'{path}.init_cfg', item
        for key, value in node.items():
            if key != 'init_cfg':
                yield from pretrained_inits(value, f'{path}.{key}')
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pretrained_inits(value, f'{path}.{i}')


def check_pretrained(cfg: Config) -> None:
    """Raise :class:`MissingCheckpointError` if a local ``Pretrained`` checkpoint is missing.

    URLs and other schemes (``https://``, ``open-mmlab://``) are left to mmengine, which downloads them. A config
    can say where its default checkpoint comes from in a top-level ``pretrained_source`` string, printed when the
    missing file is the config's own ``pretrained`` path.
    """
    for where, init in pretrained_inits(cfg.get('model')):
        ckpt = init.get('checkpoint')
        if not ckpt or '://' in ckpt or osp.exists(osp.expanduser(ckpt)):
            continue
        lines = [f'Checkpoint for {where} not found: {ckpt}']
        if cfg.get('pretrained_source') and ckpt == cfg.get('pretrained'):
            lines.append(f'Download it from: {cfg.pretrained_source}')
        lines += [f'Save it as {ckpt}, or pass the file you have with',
                  f'    --cfg-options {where}.checkpoint=PATH',
                  f'(train from random weights with --cfg-options {where}=None; --demo needs no checkpoint).']
        raise MissingCheckpointError('\n'.join(lines))
