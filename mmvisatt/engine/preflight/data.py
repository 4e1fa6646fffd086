"""The data a run reads, checked before the Runner starts: that the datasets are on disk in the layout their type
reads, that the evaluators score against the files their loaders load, and what the config says about classes
against what the annotation files and a sample of the images and segmentation maps hold.

mmdet and mmseg trust all of it. A disagreement shows up late and far from its cause: a missing folder fails inside a
dataloader worker; heads left at 80 classes train a whole epoch and then fail in ``CocoMetric.results2json``; a
boxes-only file with a mask head raises ``KeyError: 'mask'`` at the first iteration; colour segmentation maps give a
``cross_entropy`` error; crowd-only or zero-area boxes train on background without a word.
:func:`check_dataset_contents` finds these in the files themselves and raises one :class:`AnnotationError` that lists
every problem, each with the file, what is wrong and the fix. What can be legitimate (training on a subset of a
file's categories, some boxes dropped) is logged as a warning.

Annotation files above :data:`MAX_CHECKED_ANN_BYTES` are skipped (the big public sets are consistent, and parsing
them twice costs start-up time); images and maps are checked on a sample of :data:`SAMPLE` files.
"""
import contextlib
import json
import logging
import os
import os.path as osp
import re
import importlib
import inspect
from collections import Counter
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.config import Config
from mmengine.logging import print_log

from mmvisatt.checkpoint.loading import abbreviate
from mmvisatt.datasets.transforms import IMAGE_LOADERS, CorruptImageError, image_truncation, truncated_image_message

# Annotation files above this size are left to the dataset: reading them twice would cost seconds of start-up and
# gigabytes of memory, and the big public sets are known to be consistent. The check is for hand-made sets.
MAX_CHECKED_ANN_BYTES = 64 * 2**20
SAMPLE = 16

# Share of a training file's annotations mmdet drops (zero area, outside the image, or naming no image of the
# file) above which a warning is logged, and above which training does not start: a set that loses a fifth of its
# objects is a set whose boxes are in another format (x1, y1, x2, y2; normalised) or whose image ids are off.
DROPPED_WARN_FRACTION = 0.01
DROPPED_ERROR_FRACTION = 0.2

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')

_EVALUATORS = {'val_dataloader': 'val_evaluator', 'test_dataloader': 'test_evaluator'}

# EXIF orientations that rotate by 90 degrees: OpenCV applies them on loading, so the file's header has the
# annotation's width and height swapped.
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}
# Images whose EXIF orientation is read (headers only: milliseconds each), and the share of them, oriented and not
# shown by their annotated size to be annotated upright, above which training does not start: a set of phone photos
# annotated on the stored pixels has most of its images tagged; a few tagged ones in a large set are worth a warning.
ORIENTATION_SAMPLE = 256
ORIENTATION_ERROR_FRACTION = 0.05

# dataset type -> (name, where to get it)
DATASET_SOURCES = {
    'CocoDataset': ('COCO 2017', 'https://cocodataset.org/#download (2017 Train/Val images and '
                                 '2017 Train/Val annotations)'),
    'ADE20KDataset': ('ADE20K', 'http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip'),
}


class MissingDataError(FileNotFoundError):
    """The dataset a config points at is not on disk."""


class AnnotationError(ValueError):
    """An annotation file cannot be used with the config."""


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


def image_dirs(cfg: Config) -> List[str]:
    """The image folders of every loader's datasets, for messages about an image that names no file."""
    loaders = ('train_dataloader', 'val_dataloader', 'test_dataloader')
    dirs = {image_dir(d) for loader in loaders for d in leaf_datasets((cfg.get(loader) or {}).get('dataset'))}
    return sorted(d for d in dirs if d)


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
    lines.append('To try the pipeline without it, add --demo: it trains and evaluates the same model on small '
                 'generated data.')
    raise MissingDataError('\n'.join(lines))


# mmpretrain datasets that, without an ann_file, take each sub-folder of the image folder as a class
_FOLDER_PER_CLASS = ('ImageNet', 'CustomDataset')


def _check_class_folders(dataset: dict, where: str) -> None:
    """An mmpretrain folder dataset without ``ann_file`` needs one sub-folder per class; images loose in the
    folder (ImageNet's val set as downloaded, say) make mmpretrain fail with a bare assertion."""
    folder, ann_file = image_dir(dataset), dataset.get('ann_file')
    split = dataset.get('split')
    if split and not dataset.get('data_prefix'):
        # mmpretrain's ImageNet: split='train' reads data_root/train (split 'test': val), or the list
        # data_root/meta/<split>.txt where it exists
        folder = _join(dataset.get('data_root'), 'val' if split == 'test' else split)
        listed = _join(dataset.get('data_root'), osp.join('meta', f'{split}.txt'))
        ann_file = ann_file or (listed if osp.isfile(listed) else None)
    if dataset.get('type') not in _FOLDER_PER_CLASS or ann_file or not folder or not osp.isdir(folder):
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


def _ann_file(dataset: dict) -> Optional[str]:
    ann = dataset.get('ann_file')
    if not ann:
        return None
    root = dataset.get('data_root')
    return ann if root is None or osp.isabs(ann) else osp.join(root, ann)


def check_evaluator_files(cfg: Config) -> None:
    """Raise :class:`AnnotationError` when ``val_evaluator`` / ``test_evaluator`` score against another annotation
    file than their dataset loads (data moved with ``--cfg-options *.dataset.data_root=...`` while the
    evaluator's ``ann_file`` still names the old one): the scores would silently be against another set."""
    problems = []
    for loader, evaluator in (('val_dataloader', 'val_evaluator'), ('test_dataloader', 'test_evaluator')):
        metrics = cfg.get(evaluator)
        datasets = list(leaf_datasets((cfg.get(loader) or {}).get('dataset')))
        if not metrics or len(datasets) != 1:
            continue
        dataset_file = _ann_file(datasets[0])
        for i, metric in enumerate(metrics if isinstance(metrics, (list, tuple)) else [metrics]):
            metric_file = metric.get('ann_file') if isinstance(metric, dict) else None
            if not metric_file or not dataset_file or osp.normpath(metric_file) == osp.normpath(dataset_file):
                continue
            key = f'{evaluator}.ann_file' if not isinstance(metrics, (list, tuple)) else f'{evaluator}.{i}.ann_file'
            problems.append(f'{key} is {metric_file}, but {loader} loads {dataset_file}: the scores would be '
                            f'computed against another set. Pass --cfg-options {key}={dataset_file}')
    if problems:
        raise AnnotationError('\n'.join(problems))


def read_coco_file(path: str) -> Any:
    """The parsed JSON of ``path``; invalid JSON is an :class:`AnnotationError`."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise AnnotationError(f'{path} is not valid JSON ({error}); re-export or re-download it.') from None


def check_coco_annotations(path: str, train: bool = True, data: Any = None) -> None:
    """Raise :class:`AnnotationError` if the COCO file at ``path`` (or its parsed ``data``) is not valid JSON, has
    no images, (for training) no annotations, or annotations whose ``category_id`` is not among its
    ``categories``. How the file fits the config's classes and model is
    :func:`check_dataset_contents`'s part."""
    data = read_coco_file(path) if data is None else data
    if not isinstance(data, dict):
        raise AnnotationError(f'{path} is not a COCO instances file: it holds a {type(data).__name__}, not an '
                              f'object with "images", "annotations" and "categories".')
    missing = [k for k in ('images', 'annotations', 'categories') if k not in data]
    if missing:
        raise AnnotationError(f'{path} is not a COCO instances file: it has no {missing} (it needs "images", '
                              f'"annotations" and "categories" lists).')
    if not data['images']:
        raise AnnotationError(f'{path} lists no images; point ann_file at the right split or add the images.')
    if train and not data['annotations']:
        raise AnnotationError(f'{path} has images but no annotations: a detector cannot be trained on it (every '
                              f'image would be filtered out as empty). Check that you exported the instances file.')
    names = {c['id']: c.get('name') for c in data['categories']}
    counts: Dict[Any, int] = {}
    for ann in data['annotations']:
        cat = ann.get('category_id')
        if cat not in names:
            counts[cat] = counts.get(cat, 0) + 1
    if counts:
        listed = ', '.join(f'{c} ({n} annotations)' for c, n in sorted(counts.items(), key=lambda x: str(x[0])))
        raise AnnotationError(f'{path}: annotations use category_id {listed}, which "categories" does not define '
                              f'(defined: {sorted(names.items())}). Add the categories or drop those annotations.')


class _Findings:
    """What one pre-flight found, and the annotation files it parsed (the val file is also the evaluator's; they are
    dropped with the pre-flight, not kept for the whole run)."""

    def __init__(self) -> None:
        self.errors: List[str] = []
        self.warnings: List[str] = []
        self.parsed: Dict[str, Any] = {}


def _datasets(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, str, dict]]:
    """``(loader, config path of the dataset, dataset config)`` of every leaf dataset of ``loaders``."""
    found = []
    for loader in loaders:
        root = (cfg.get(loader) or {}).get('dataset')
        leaves = list(leaf_datasets(root))
        for i, dataset in enumerate(leaves):
            # a wrapped dataset's path is only unambiguous for a single leaf; name the loader otherwise
            path = f'{loader}.dataset' if root is dataset else f'{loader}.dataset.dataset'
            found.append((loader, path if len(leaves) == 1 else f'{loader} (dataset {i})', dataset))
    return found


def _dataset_class(dataset: dict, scope: str) -> Optional[type]:
    try:
        registry = importlib.import_module(f'{scope}.registry').DATASETS
        return registry.get(dataset.get('type'))
    except (ImportError, KeyError, AttributeError):
        return None


def _setting(dataset: dict, cls: Optional[type], name: str, default: Any = None) -> Any:
    """A dataset argument: the config's value, else the class's default."""
    if name in dataset:
        return dataset[name]
    if cls is not None:
        parameter = inspect.signature(cls.__init__).parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return default


def _classes(dataset: dict, cls: Optional[type]) -> Tuple[Optional[Tuple[str, ...]], bool]:
    """The dataset's class names and whether the config sets them (False: the dataset type's default); None for
    a string, which :func:`_check_classes` reports (its letters are no class names)."""
    classes = (dataset.get('metainfo') or {}).get('classes')
    if isinstance(classes, str):
        return None, True
    if classes is not None:
        return tuple(classes), True
    default = getattr(cls, 'METAINFO', {}).get('classes') if cls is not None else None
    return (tuple(default) if default is not None else None), False


def head_num_classes(node: Any, path: str = 'model') -> List[Tuple[str, int]]:
    """``(config path, num_classes)`` of every classifying head of a model config (the class-agnostic RPN and the
    backbone's own classifier excluded)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ('rpn_head', 'backbone', 'train_cfg', 'test_cfg', 'data_preprocessor', 'init_cfg'):
                continue
            if key == 'num_classes' and isinstance(value, int) and 'head' in path:
                found.append((f'{path}.num_classes', value))
            else:
                found += head_num_classes(value, f'{path}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            found += head_num_classes(value, f'{path}.{i}')
    return found


def _classes_option(path: str, classes: Sequence[str]) -> str:
    return f'"{path}.metainfo.classes=({",".join(classes)},)"'


def _check_classes(cfg: Config, datasets: List[Tuple[str, str, dict]], scope: str, found: _Findings) -> None:
    """Heads against the train classes, and val / test classes against train's."""
    per_loader: Dict[str, Tuple[str, Tuple[str, ...], bool]] = {}
    for loader, where, dataset in datasets:
        named = (dataset.get('metainfo') or {}).get('classes')
        if isinstance(named, str):
            found.errors.append(
                f'{where}.metainfo.classes is the string {named!r}, not a tuple of class names: in Python '
                f'({named!r}) is just a string (its {len(named)} letters would count as classes). Write '
                f'classes=({named!r},) with a trailing comma, and give the heads num_classes=1.')
            return
        classes, explicit = _classes(dataset, _dataset_class(dataset, scope))
        if classes is not None and loader not in per_loader:
            per_loader[loader] = (where, classes, explicit)
    reference = per_loader.get('train_dataloader') or next(iter(per_loader.values()), None)
    if reference is None:
        return
    ref_where, ref_classes, ref_explicit = reference
    origin = 'metainfo.classes' if ref_explicit else 'classes (its type\'s default; metainfo is not set)'
    heads = [(path, n) for path, n in head_num_classes(cfg.get('model')) if n != len(ref_classes)]
    # mmseg's binary heads predict one channel for two classes
    heads = [(path, n) for path, n in heads if not (n == 1 and len(ref_classes) == 2)]
    if heads:
        listed = ', '.join(f'{path}={n}' for path, n in heads)
        fix = ' '.join(f'{path}={len(ref_classes)}' for path, _ in heads)
        found.errors.append(
            f'{listed}, but {ref_where} has {len(ref_classes)} {origin}: {abbreviate(ref_classes)}. A head needs '
            f'one output per class: with more, evaluation fails after the first epoch; with fewer, labels fall '
            f'outside the head. Pass --cfg-options {fix}')
    for loader, (where, classes, explicit) in per_loader.items():
        if classes == ref_classes:
            continue
        state = 'sets' if explicit else 'does not set metainfo, so it uses its type\'s default'
        found.errors.append(
            f'{where} {state} {len(classes)} classes ({abbreviate(classes)}), but {ref_where} has '
            f'{len(ref_classes)} ({abbreviate(ref_classes)}): the model would be evaluated on other classes than '
            f'it learns. Set the same metainfo=dict(classes=...) on every dataset (a top-level metainfo variable '
            f'in your config), or pass --cfg-options {_classes_option(where, ref_classes)}')


def _pipeline_loads_masks(dataset: dict) -> bool:
    return any(isinstance(t, dict) and 'LoadAnnotations' in str(t.get('type')) and t.get('with_mask')
               for t in dataset.get('pipeline') or [])


def _read_json(path: str, found: _Findings) -> Any:
    """A COCO file's content, parsed once per pre-flight; None when it is missing or too large to check."""
    if not osp.isfile(path) or osp.getsize(path) > MAX_CHECKED_ANN_BYTES:
        return None
    key = osp.abspath(path)
    if key not in found.parsed:
        found.parsed[key] = read_coco_file(path)
    return found.parsed[key]


def _bad_polygons(segmentation: Any) -> bool:
    return isinstance(segmentation, list) and any(len(p) < 6 or len(p) % 2 for p in segmentation)


def _coco_content(path: str, data: dict, where: str, train: bool, masks: bool, classes: Tuple[str, ...],
                  explicit: bool, found: _Findings) -> List[int]:
    """Checks of one COCO file's content; returns the category ids the classes map to (mmdet's ``cat_ids``)."""
    categories = data['categories']
    cat_ids = [c['id'] for c in categories if c.get('name') in classes]
    names = {c['id']: c.get('name') for c in categories}
    file_names = set(names.values())
    if not cat_ids and train:
        found.errors.append(
            f'{path}: none of its categories ({abbreviate([c.get("name") for c in categories])}) is among the '
            f'{len(classes)} classes of {where} ({abbreviate(classes)}), so every annotation would be dropped '
            f'(mmdet then fails with "need at least one array to concatenate"). Set metainfo=dict(classes=...) to '
            f'the file\'s category names on every dataset, and the heads\' num_classes to their number.')
    if not cat_ids:
        return cat_ids
    if [names[i] for i in cat_ids] != [c for c in classes if c in file_names]:
        found.warnings.append(
            f'{path}: its categories come in another order than the classes of {where}. mmdet numbers labels in '
            f'the file\'s order, so predictions would carry the wrong class names; list the classes as the file '
            f'does: {abbreviate([names[i] for i in cat_ids], 100)}')
    absent = [c for c in classes if c not in file_names]
    if train and absent:
        found.warnings.append(f'{path} has no category for classes {abbreviate(absent)} of {where}: the model '
                              f'will never see them.')
    if not train:
        return cat_ids
    counts = Counter(names.get(a.get('category_id')) for a in data['annotations'])
    outside = {name: n for name, n in counts.items() if name not in classes}
    if outside and not explicit:
        found.errors.append(
            f'{path} has categories {abbreviate(sorted(map(str, outside)))} that are not among the default classes '
            f'of {where} (its metainfo is not set, so it uses its type\'s {len(classes)}). Set '
            f'metainfo=dict(classes=...) to the file\'s category names on every dataset, and the heads\' '
            f'num_classes to their number.')
    elif outside:
        found.warnings.append(
            f'{path}: {sum(outside.values())} annotations of categories {abbreviate(sorted(map(str, outside)))} '
            f'are not among the classes of {where} and are ignored (fine when you train on a subset).')
    _check_instances(path, data, where, set(cat_ids), masks, found)
    return cat_ids


def _check_instances(path: str, data: dict, where: str, cat_ids: set, masks: bool, found: _Findings) -> None:
    """What mmdet's ``CocoDataset.parse_data_info`` would keep of the training annotations."""
    images = {i.get('id'): i for i in data['images']}
    usable = crowd = dropped = orphans = without_mask = bad_polygon = 0
    examples: Dict[str, Any] = {}
    for ann in data['annotations']:
        if ann.get('category_id') not in cat_ids or ann.get('ignore', False):
            continue
        image = images.get(ann.get('image_id'))
        if image is None:
            orphans += 1
            examples.setdefault('orphan', (ann.get('id'), ann.get('image_id')))
            continue
        x, y, w, h = ann['bbox']
        inside = (min(x + w, image['width']) - max(x, 0)) > 0 and (min(y + h, image['height']) - max(y, 0)) > 0
        if not inside or ann['area'] <= 0 or w < 1 or h < 1:
            dropped += 1
            examples.setdefault('dropped', ann.get('id'))
            continue
        if ann.get('iscrowd', False):
            crowd += 1
            continue
        usable += 1
        if masks and not ann.get('segmentation'):
            without_mask += 1
            examples.setdefault('mask', ann.get('id'))
        elif masks and _bad_polygons(ann.get('segmentation')):
            bad_polygon += 1
            examples.setdefault('polygon', ann.get('id'))
    total = usable + crowd + dropped + orphans
    if orphans:
        ann_id, image_id = examples['orphan']
        message = (f'{path}: {orphans} of {total} annotations name an image_id that is not among the file\'s images '
                   f'(e.g. annotation {ann_id} names image {image_id}): mmdet reads the annotations of the listed '
                   f'images only, so these are never trained on. Add those images to "images", or fix the '
                   f'annotations\' image_id.')
        (found.errors if orphans > DROPPED_ERROR_FRACTION * total else found.warnings).append(message)
    if without_mask:
        found.errors.append(
            f'{path}: {without_mask} of {total} annotations have no "segmentation" (e.g. id {examples["mask"]}), but '
            f'the pipeline of {where} loads masks (the model has a mask head): training would fail with '
            f'KeyError: \'mask\'. Add polygons or RLE masks to the file, or use a box-only config (Faster R-CNN, '
            f'RetinaNet).')
    if bad_polygon:
        found.warnings.append(
            f'{path}: {bad_polygon} annotations have polygons of fewer than 3 points (e.g. id '
            f'{examples["polygon"]}); mmdet ignores those instances in training.')
    if total and not usable:
        found.errors.append(
            f'{path}: none of its {total} annotations can be trained on ({crowd} are crowd regions, {dropped} have '
            f'zero area or lie outside their image, {orphans} name no image of the file): the model would learn '
            f'background only. Set iscrowd=0 for objects and check the boxes (COCO bbox is [x, y, width, height] '
            f'in pixels).')
    elif dropped > DROPPED_ERROR_FRACTION * total:
        found.errors.append(
            f'{path}: {dropped} of {total} annotations have zero area or lie outside their image (e.g. id '
            f'{examples["dropped"]}), more than {DROPPED_ERROR_FRACTION:.0%}: training would go on without them. '
            f'COCO bbox is [x, y, width, height] in pixels of the image\'s "width" x "height": convert boxes given '
            f'as [x1, y1, x2, y2] or normalised to 0..1, or remove the broken annotations.')
    elif dropped > DROPPED_WARN_FRACTION * total:
        found.warnings.append(
            f'{path}: {dropped} of {total} annotations have zero area or lie outside their image (e.g. id '
            f'{examples["dropped"]}) and are dropped; COCO bbox is [x, y, width, height] in pixels.')


def _polygon_extent(segmentation: Any) -> Optional[Tuple[float, float, float, float]]:
    """(min x, min y, max x, max y) of a polygon segmentation; None for RLE or no polygon."""
    if not isinstance(segmentation, list) or not segmentation:
        return None
    xs = [v for p in segmentation if isinstance(p, list) for v in p[0::2]]
    ys = [v for p in segmentation if isinstance(p, list) for v in p[1::2]]
    return (min(xs), min(ys), max(xs), max(ys)) if xs and ys else None


def _corner_boxes(data: dict) -> Tuple[int, int, Any]:
    """How many boxes read as [x1, y1, x2, y2] rather than COCO's [x, y, width, height], of how many that could be
    told apart, and an example id. A box is told apart by its polygon (width and height equal to the polygon's far
    corner instead of its extent) or, without one, by its image (x + w past the right edge while w fits the image
    as a coordinate)."""
    images = {i.get('id'): i for i in data['images']}
    corners = checked = 0
    example = None
    for ann in data['annotations']:
        x, y, w, h = ann['bbox']
        extent = _polygon_extent(ann.get('segmentation'))
        if extent is not None:
            x0, y0, x1, y1 = extent
            if x0 < 2 and y0 < 2:  # at the image corner, the two readings agree
                continue
            checked += 1
            as_corner = abs(w - x1) <= 2 and abs(h - y1) <= 2
            as_size = abs(w - (x1 - x0)) <= 2 and abs(h - (y1 - y0)) <= 2
            if as_corner and not as_size:
                corners += 1
                example = example if example is not None else ann.get('id')
            continue
        image = images.get(ann.get('image_id'))
        if image is None or (x < 2 and y < 2):
            continue
        checked += 1
        if (x + w > image['width'] + 1 or y + h > image['height'] + 1) and w > x and h > y \
                and w <= image['width'] and h <= image['height']:
            corners += 1
            example = example if example is not None else ann.get('id')
    return corners, checked, example


def _check_ids_and_boxes(path: str, data: dict, where: str, train: bool, found: _Findings) -> None:
    """Mistakes of a COCO file that mmdet takes without a word: duplicate image ids (merged exports), an
    evaluation set without annotations, boxes written as corners."""
    repeated = [i for i, n in Counter(image.get('id') for image in data['images']).items() if n > 1]
    if repeated:
        found.errors.append(
            f'{path}: {len(repeated)} image ids occur more than once (e.g. {abbreviate(repeated)}), as after merging '
            f'two exports: mmdet would give one image\'s boxes to another. Renumber the images (and their '
            f'annotations\' image_id) so that every id is unique.')
    if not train and data['images'] and not data['annotations']:
        found.errors.append(
            f'{path} ({where}) has {len(data["images"])} images but no annotations: COCO evaluation would report -1 '
            f'for every metric. Point ann_file at the annotated file of this set (an image-info-only file such as '
            f'image_info_test-dev is for tools/test.py with format_only=True).')
    corners, checked, example = _corner_boxes(data)
    if corners and corners * 2 >= checked:
        found.errors.append(
            f'{path}: {corners} of {checked} boxes that can be checked read as [x1, y1, x2, y2] (e.g. annotation id '
            f'{example}: its width and height equal its polygon\'s far corner, or reach past the image), but COCO '
            f'bbox is [x, y, width, height]: the model would train on inflated boxes. Convert them: width = x2 - x1, '
            f'height = y2 - y1 (and area = width * height, or the polygon\'s area).')


def _check_eval_polygons(path: str, data: dict, where: str, found: _Findings) -> None:
    bad = [a.get('id') for a in data['annotations'] if _bad_polygons(a.get('segmentation'))]
    if bad:
        found.errors.append(
            f'{path}: {len(bad)} annotations have polygons of fewer than 3 points (ids {abbreviate(bad)}); '
            f'pycocotools fails on them when {where} is evaluated. Remove those polygons (or annotations).')


def _check_evaluator(cfg: Config, loader: str, classes: Tuple[str, ...], found: _Findings) -> None:
    """CocoMetric maps labels to the categories of its own ``ann_file`` by name: a class it lacks makes
    ``results2json`` fail with an IndexError after the first epoch."""
    metrics = cfg.get(_EVALUATORS[loader])
    for metric in metrics if isinstance(metrics, (list, tuple)) else [metrics]:
        if not isinstance(metric, dict) or 'CocoMetric' not in str(metric.get('type')) or not metric.get('ann_file'):
            continue
        try:
            data = _read_json(metric['ann_file'], found)
        except (OSError, AnnotationError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get('categories'), list):
            continue
        names = {c.get('name') for c in data['categories']}
        missing = [c for c in classes if c not in names]
        if missing:
            found.errors.append(
                f'{_EVALUATORS[loader]}.ann_file {metric["ann_file"]} has no category for classes '
                f'{abbreviate(missing)} of {loader}: CocoMetric would fail with an IndexError when it converts '
                f'the predictions. Point it at the annotation file of the same set, or set the classes to its '
                f'category names.')


@contextlib.contextmanager
def _no_pixel_limit() -> Iterator[None]:
    """PIL refuses to open an image above twice ``Image.MAX_IMAGE_PIXELS`` (its decompression-bomb guard, 179 MPixel
    by default). These checks read headers only and OpenCV loads such files, so the guard is off while they run."""
    from PIL import Image
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _image_header(path: str) -> Tuple[int, int, int]:
    """(width, height) as stored and the EXIF orientation (1 when there is none), from the header only."""
    from PIL import Image
    with _no_pixel_limit(), Image.open(path) as image:
        width, height = image.size
        orientation = image.getexif().get(0x0112) or 1
    return width, height, orientation


def _loaded_size(width: int, height: int, orientation: int, ignore_orientation: bool = False) -> Tuple[int, int]:
    """(width, height) as OpenCV loads an image stored at ``width`` x ``height`` with EXIF ``orientation`` (the
    rotation applied unless ``ignore_orientation``)."""
    turned = orientation in _TRANSPOSING_ORIENTATIONS and not ignore_orientation
    return (height, width) if turned else (width, height)


def _image_size(path: str) -> Tuple[int, int]:
    """(width, height) as OpenCV loads the file (EXIF rotation applied), from the header only."""
    return _loaded_size(*_image_header(path))


def _ignores_orientation(dataset: dict) -> bool:
    """Whether the dataset's pipeline loads images as stored (``color_type`` with ``ignore_orientation``)."""
    for step in dataset.get('pipeline') or []:
        if isinstance(step, dict) and str(step.get('type', '')).split('.')[-1] in IMAGE_LOADERS:
            return 'ignore_orientation' in str(step.get('color_type', 'color'))
    return False


def _orientation_message(path: str, where: str, turned: List[Tuple[str, int, str]], sampled: int) -> str:
    """What the EXIF-oriented images of a sample mean for the annotations, with the two fixes."""
    names = abbreviate([f'{osp.basename(f)} (orientation {o})' for f, o, _ in turned], 3)
    verdicts = Counter(v for _, _, v in turned)
    if verdicts['stored'] == len(turned):
        told = ('Their annotated width and height are those of the pixels as stored, so the boxes and masks were '
                'drawn on the stored pixels: load the images as stored (the first fix).')
    elif verdicts['stored']:
        told = (f'{verdicts["stored"]} of them have annotated sizes of the pixels as stored (annotated unrotated); '
                "the others' sizes cannot tell (square images, or a flip or half turn that keeps the size).")
    else:
        told = ('Their sizes cannot tell which way they were annotated (square images, or a flip or half turn that '
                "keeps the size): draw one image's boxes on it as loaded and as stored to see which fits.")
    return (f'{len(turned)} of {sampled} sampled images of {where} ({path}) carry an EXIF orientation other than 1: '
            f"{names}. mmcv's loader (OpenCV) turns such an image upright when it loads it, while its boxes and masks "
            f'stay where they were annotated. {told} The fixes: (1) load them as stored, with '
            f"color_type='color_ignore_orientation' in the pipeline's LoadCheckedImageFromFile (train and test "
            f'pipelines), if the annotations were made on the stored pixels; or (2) re-save the images upright '
            f'(PIL.ImageOps.exif_transpose) and rotate their annotations with them, if they were made on the upright '
            f'view.')


def _check_image_sizes(path: str, data: dict, dataset: dict, folder: str, where: str, found: _Findings) -> None:
    """A sample of the images against the annotated sizes, and their EXIF orientation: past
    :data:`ORIENTATION_ERROR_FRACTION` of the sample oriented and not demonstrably annotated upright, an error,
    below it a warning."""
    ignore = _ignores_orientation(dataset)
    sample = _sample(data['images'], ORIENTATION_SAMPLE)
    turned: List[Tuple[str, int, str]] = []  # (file, orientation, 'stored' / 'unknown')
    for image in sample:
        file = osp.join(folder, image['file_name'])
        try:
            width, height, orientation = _image_header(file)
        except OSError:
            continue  # not decodable: the loader's own error names the file
        annotated = (image['width'], image['height'])
        if orientation != 1 and not ignore:
            if orientation in _TRANSPOSING_ORIENTATIONS and width != height:
                if annotated == (width, height):
                    turned.append((file, orientation, 'stored'))
                    continue
            else:
                turned.append((file, orientation, 'unknown'))
        size = _loaded_size(width, height, orientation, ignore)
        if size != annotated:
            found.errors.append(
                f'{path} says {image["file_name"]} is {image["width"]}x{image["height"]}, but {file} is '
                f'{size[0]}x{size[1]}: boxes and masks would not fit the image (this ends in NaN losses). '
                f'Regenerate the file\'s width/height (and boxes) from the images you train on.')
            return
    if turned:
        message = _orientation_message(path, where, turned, len(sample))
        if len(turned) > ORIENTATION_ERROR_FRACTION * len(sample):
            found.errors.append(message)
        else:
            found.warnings.append(f'{message} (At most {ORIENTATION_ERROR_FRACTION:.0%} of the sample: a warning.)')


def _sample(items: Sequence[Any], n: int = SAMPLE) -> List[Any]:
    if len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def _file_problems(files: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The missing and the empty files among ``files`` (a ``stat`` each: a second for COCO train on a local disk)."""
    missing, empty = [], []
    for file in files:
        try:
            if os.stat(file).st_size == 0:
                empty.append(file)
        except FileNotFoundError:
            missing.append(file)
    return missing, empty


def _empty_images_error(empty: List[str], where: str) -> str:
    return (f'{len(empty)} image files of {where} are empty (0 bytes): {abbreviate(empty, 4)}. Replace them '
            f'(re-download or re-copy) or remove them from the annotations; OpenCV would fail on them without naming '
            f'the file.')


def _check_coco_images(path: str, data: dict, dataset: dict, where: str, found: _Findings) -> None:
    root = dataset.get('data_root') or ''
    prefix = (dataset.get('data_prefix') or {}).get('img', '')
    folder = osp.join(root, prefix)
    files = [osp.join(folder, image['file_name']) for image in data['images']]
    missing, empty = _file_problems(files)
    if missing:
        found.errors.append(f'{len(missing)} of the {len(files)} images listed in {path} do not exist '
                            f'({abbreviate(missing, 4)}): {where}.data_prefix.img={prefix!r} under '
                            f'data_root={root!r} may point at the wrong folder.')
    if empty:
        found.errors.append(_empty_images_error(empty, where))
    if missing or empty:
        return
    _check_image_sizes(path, data, dataset, folder, where, found)


def _check_size_filter(path: str, data: dict, dataset: dict, cat_ids: List[int], where: str,
                       found: _Findings) -> None:
    """The other way to an empty training set: ``filter_cfg`` removing every image."""
    filter_cfg = dataset.get('filter_cfg') or {}
    min_size = filter_cfg.get('min_size', 0)
    wanted = set(cat_ids)
    annotated = {a.get('image_id') for a in data['annotations'] if a.get('category_id') in wanted}
    kept = [i for i in data['images']
            if min(i['width'], i['height']) >= min_size
            and (not filter_cfg.get('filter_empty_gt') or i.get('id') in annotated)]
    if data['images'] and not kept:
        smallest = max(min(i['width'], i['height']) for i in data['images'])
        found.errors.append(
            f'{path}: {where}.filter_cfg={dict(filter_cfg)} removes every image (the largest has a short side of '
            f'{smallest} pixels, min_size is {min_size}); mmdet would fail with "need at least one array to '
            f'concatenate". Pass --cfg-options {where}.filter_cfg.min_size={smallest}')


def _check_coco_dataset(cfg: Config, loader: str, where: str, dataset: dict, scope: str, found: _Findings) -> None:
    path = _ann_file(dataset)
    if not path or not osp.isfile(path):
        return
    train = loader == 'train_dataloader'
    if osp.getsize(path) > MAX_CHECKED_ANN_BYTES:
        print_log(f'pre-flight: {path} is over {MAX_CHECKED_ANN_BYTES >> 20} MiB; its content is not checked.',
                  logger='current')
        return
    data = _read_json(path, found)
    check_coco_annotations(path, train=train, data=data)
    required = {'images': ('id', 'file_name', 'width', 'height'),
                'annotations': ('id', 'image_id', 'category_id', 'bbox', 'area')}
    for part, keys in required.items():
        lacking = Counter(k for item in data[part] for k in keys if k not in item)
        if lacking:
            found.errors.append(f'{path}: {abbreviate([f"{n} {part} lack {k!r}" for k, n in lacking.items()])}; '
                                f'mmdet reads these keys of every entry. Re-export the file in COCO format.')
            return
    bad_boxes = [a.get('id') for a in data['annotations']
                 if not (isinstance(a['bbox'], (list, tuple)) and len(a['bbox']) == 4)]
    if bad_boxes:
        found.errors.append(f'{path}: {len(bad_boxes)} annotations have a bbox that is not [x, y, width, height] '
                            f'(ids {abbreviate(bad_boxes)}). Re-export the file in COCO format.')
        return
    _check_ids_and_boxes(path, data, where, train, found)
    classes, explicit = _classes(dataset, _dataset_class(dataset, scope))
    if classes is None:
        return
    masks = _pipeline_loads_masks(dataset)
    cat_ids = _coco_content(path, data, where, train, masks, classes, explicit, found)
    if not train and masks:
        _check_eval_polygons(path, data, where, found)
    if train and cat_ids:
        _check_size_filter(path, data, dataset, cat_ids, where, found)
    if loader in _EVALUATORS:
        _check_evaluator(cfg, loader, classes, found)
    _check_coco_images(path, data, dataset, where, found)


def _list_files(folder: str) -> List[str]:
    """Files under ``folder`` relative to it, sorted (mmseg lists them recursively)."""
    files = []
    for directory, _, names in os.walk(folder):
        files += [osp.relpath(osp.join(directory, n), folder) for n in names]
    return sorted(files)


def _check_seg_dataset(cfg: Config, where: str, dataset: dict, scope: str, found: _Findings) -> None:
    """An mmseg folder dataset: images with the expected suffix, and a sample of maps (one channel, the image's
    size, labels within ``num_classes``)."""
    cls = _dataset_class(dataset, scope)
    if dataset.get('ann_file'):
        return  # split files name the images; the folder listing below does not apply
    root = dataset.get('data_root') or ''
    prefix = dataset.get('data_prefix') or {}
    img_dir, seg_dir = osp.join(root, prefix.get('img_path', '')), osp.join(root, prefix.get('seg_map_path', ''))
    if not osp.isdir(img_dir):
        return
    img_suffix = _setting(dataset, cls, 'img_suffix', '.jpg')
    seg_suffix = _setting(dataset, cls, 'seg_map_suffix', '.png')
    files = _list_files(img_dir)
    images = [f for f in files if f.endswith(img_suffix)]
    if not images:
        suffixes = Counter(osp.splitext(f)[1] for f in files if osp.splitext(f)[1])
        if suffixes:
            suffix, n = suffixes.most_common(1)[0]
            found.errors.append(
                f'{img_dir} has no {img_suffix} images but {n} {suffix} files: mmseg would find no data ("need at '
                f'least one array to concatenate"). Pass --cfg-options {where}.img_suffix={suffix}')
        return
    _, empty = _file_problems([osp.join(img_dir, f) for f in images])
    if empty:
        found.errors.append(_empty_images_error(empty, where))
    classes, _ = _classes(dataset, cls)
    num_classes = next((n for _, n in head_num_classes(cfg.get('model'))), None) or (len(classes) if classes else None)
    reduce_zero = _setting(dataset, cls, 'reduce_zero_label', False)
    ignore_index = _setting(dataset, cls, 'ignore_index', 255)
    for image in _sample(images):
        seg_map = osp.join(seg_dir, image[:-len(img_suffix)] + seg_suffix)
        if not osp.isfile(seg_map):
            ids = seg_map.replace('labelTrainIds', 'labelIds')
            if seg_suffix.endswith('labelTrainIds.png') and osp.isfile(ids):
                found.errors.append(
                    f'{seg_map}, the map of {osp.join(img_dir, image)}, does not exist, but {osp.basename(ids)} does: '
                    f'the Cityscapes download has label ids, and training reads the 19 train ids that mmseg\'s '
                    f'converter writes. Run it once: python tools/dataset_converters/cityscapes.py {root or "."} '
                    f'(in the mmsegmentation repository; it needs cityscapesscripts: pip install cityscapesscripts).')
                return
            found.errors.append(f'{seg_map}, the map of {osp.join(img_dir, image)}, does not exist: check '
                                f'{where}.data_prefix.seg_map_path and seg_map_suffix ({seg_suffix!r}).')
            return
        problem = _seg_map_problem(seg_map, osp.join(img_dir, image), where, num_classes, reduce_zero, ignore_index)
        if problem:
            found.errors.append(problem)
            return


def _seg_map_problem(seg_map: str, image: str, where: str, num_classes: Optional[int], reduce_zero: bool,
                     ignore_index: int) -> Optional[str]:
    from PIL import Image
    try:
        with _no_pixel_limit(), Image.open(seg_map) as label_map:
            mode, size = label_map.mode, label_map.size
            labels = np.unique(np.asarray(label_map)) if mode not in ('RGB', 'RGBA') else None
    except OSError:
        return None  # not decodable: the loader's own error names the file
    if labels is None:
        return (f'{seg_map} is a {mode} colour image; mmseg needs one-channel maps of class ids (mode L or P, '
                f'value = class index). Convert the colours to ids with your palette, e.g. '
                f'Image.fromarray(ids.astype(np.uint8)).save(path).')
    try:
        image_size = _image_size(image)
    except OSError:
        image_size = size
    if image_size != size:
        return (f'{seg_map} is {size[0]}x{size[1]}, but its image {image} is {image_size[0]}x{image_size[1]}: '
                f'the labels would not be aligned with the pixels. Save each map at its image\'s size.')
    if num_classes is None:
        return None
    ids = labels.astype(np.int64)
    if reduce_zero:
        ids = np.where(ids == 0, ignore_index, ids - 1)
        ids = np.where(ids == ignore_index - 1, ignore_index, ids)
    wrong = sorted(int(i) for i in ids if i != ignore_index and not 0 <= i < num_classes)
    if wrong:
        shift = ' after reduce_zero_label (ids shifted down by one, 0 ignored)' if reduce_zero else ''
        return (f'{seg_map} holds class ids {abbreviate(wrong)}{shift}, outside 0..{num_classes - 1} for '
                f'num_classes={num_classes} (ignore_index {ignore_index} is skipped). Set the heads\' num_classes to '
                f'cover them, relabel the maps, or set {where}.reduce_zero_label to what your maps use.')
    return None


def check_dataset_contents(cfg: Config, scope: str, loaders: Sequence[str] = LOADERS) -> List[str]:
    """Check ``cfg``'s classes, heads and data files for ``loaders`` (``scope``: the task library, whose dataset
    types give the default classes); raise :class:`AnnotationError` listing every problem, log (on rank 0) and
    return the warnings."""
    found = _Findings()
    datasets = _datasets(cfg, loaders)
    _check_classes(cfg, datasets, scope, found)
    for loader, where, dataset in datasets:
        kind = str(dataset.get('type'))
        if kind.split('.')[-1] == 'CocoDataset':
            _check_coco_dataset(cfg, loader, where, dataset, scope, found)
        elif scope == 'mmseg' and kind.endswith('Dataset'):
            _check_seg_dataset(cfg, where, dataset, scope, found)
    if found.errors:
        raise AnnotationError('\n'.join(f'- {e}' for e in dict.fromkeys(found.errors)))
    warnings = list(dict.fromkeys(found.warnings))
    # every rank checks (so that each stops on an error), rank 0 reports what may be legitimate
    if os.environ.get('RANK', '0') == '0':
        for warning in warnings:
            print_log(f'pre-flight: {warning}', logger='current', level=logging.WARNING)
    return warnings


_FAILED_IMAGE = re.compile(r'failed to load image: (\S+)')


def explain_image_error(error: BaseException, image_dirs: Sequence[str] = ()) -> Optional[CorruptImageError]:
    """A :class:`CorruptImageError` for mmcv's ``failed to load image: PATH`` assertion, for OpenCV's refusal of an
    empty file (which names no file: ``image_dirs`` are the folders to search) or for a :class:`CorruptImageError`
    (``LoadCheckedImageFromFile``), also when re-raised from a dataloader worker, else None."""
    if '!buf.empty()' in str(error):
        where = ' '.join(image_dirs) or 'the image folders'
        return CorruptImageError(
            f'An image file is empty (0 bytes): OpenCV refuses it without naming it. Find such files with '
            f'`find {where} -size 0` and replace them (re-download or re-copy), or remove them from the annotation '
            f'file.')
    if isinstance(error, CorruptImageError):
        # a worker's error arrives as 'Caught ... Original Traceback ...': keep the message, not the traceback
        _, _, message = str(error).rpartition(f'{CorruptImageError.__name__}: ')
        return CorruptImageError(message.strip())
    # the last match: a worker's traceback also quotes the source line, "f'failed to load image: {filename}'"
    paths = _FAILED_IMAGE.findall(str(error))
    if not isinstance(error, AssertionError) or not paths:
        return None
    path = paths[-1].rstrip("'\"")
    problem = image_truncation(path) if osp.isfile(path) else None
    if problem is not None:
        return CorruptImageError(truncated_image_message(path, problem))
    return CorruptImageError(
        f'Image {path} cannot be decoded: the file is corrupt, truncated to nothing, or not an image. Replace it '
        f'(re-download or re-encode), or remove it from the annotation file. Grayscale and RGBA images are fine: '
        f'they are converted to 3-channel colour on loading.')
