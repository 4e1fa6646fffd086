"""Synthetic demo datasets generated on first use.

No dataset can be downloaded in some environments (and a newcomer should not
have to fetch 20 GB of COCO to see whether the code runs at all), so this
module draws small synthetic datasets instead: textured backgrounds with
filled squares, circles and triangles on top.  They are written in the exact
on-disk formats of COCO (instance segmentation, for mmdet's ``CocoDataset``),
ADE20K (semantic segmentation, for mmseg) and ImageNet (one shape per image,
labelled with its class, for mmpretrain), so the real Mask R-CNN, UperNet and
classifier pipelines -- loading, augmentation, training, evaluation -- run
unchanged on CPU in minutes; a config only swaps ``data_root``, ``ann_file``,
``data_prefix`` and ``metainfo``.

Both datasets are rendered by the same scene generator, so an image of the
COCO set and the same-index image of the ADE set (same seed) show the same
scene.

Generation is deterministic for a given seed, takes a few seconds, and is
cached under :func:`demo_data_root`.  A set is written into a temporary
sibling directory and moved into place with one atomic ``os.replace`` once
complete, so an interrupted run or several ranks calling at the same time
never expose a half-written set.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import shutil
import uuid
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

__all__ = [
    'DEMO_COCO_CLASSES', 'DEMO_ADE_CLASSES', 'demo_data_root',
    'prepare_demo_coco', 'prepare_demo_ade', 'prepare_demo_imagenet'
]

#: Instance classes of the COCO-style set; category ids are 1, 2, 3.
DEMO_COCO_CLASSES: Tuple[str, ...] = ('square', 'circle', 'triangle')
#: Classes of the ADE-style set.  PNG value ``k`` is class ``k - 1``
#: (ADE20K convention, ``reduce_zero_label=True``); value 0 is never written.
DEMO_ADE_CLASSES: Tuple[str, ...] = ('background', ) + DEMO_COCO_CLASSES

# Bump whenever the generated pixels or annotations change: the version is
# part of the cache folder name, so stale caches are simply not found.
_GENERATOR_VERSION = 2
_MARKER = '.complete'
_DEFAULTS = dict(num_train=200, num_val=50, img_size=256, seed=0)
# The classification set draws from streams of its own, so pre-training on it never sees a detection image
# (least of all a held-out one).
_SPLIT_CODES = {'train': 0, 'val': 1, 'cls_train': 2, 'cls_val': 3}

# Keeps the smallest triangle above the 30 px visibility cut on small images.
_MIN_SIDE_PX = 12
_MIN_VISIBLE_AREA = 30
_MAX_PLACEMENT_TRIES = 20


@dataclass(frozen=True)
class SceneStyle:
    """How hard the scenes are: the background (``'textured'``: smooth noise, gradients and stripes around a base
    colour; ``'plain'``: one colour with a faint gradient), up to ``max_objects`` shapes per image, each
    ``min_size``..``max_size`` of the image side."""
    background: str
    max_objects: int
    min_size: float
    max_size: float


#: ``textured`` (the default) asks a detector to find up to four shapes by their outline on busy backgrounds;
#: ``single`` is one large shape on a plain background, the set ``--demo`` trains on, where a detector trained from
#: scratch on a CPU gets furthest in minutes (docs/getting_started.md, "The demo").
SCENE_STYLES: Dict[str, SceneStyle] = {
    'textured': SceneStyle('textured', max_objects=4, min_size=0.10, max_size=0.45),
    'single': SceneStyle('plain', max_objects=1, min_size=0.40, max_size=0.70),
}
# Sub-pixel precision for cv2 drawing, so shapes are not snapped to the grid.
_SHIFT = 4


def demo_data_root() -> str:
    """Directory that holds the cached demo datasets.

    ``$MMVISATT_DATA_CACHE`` if set, else ``~/.cache/mmvisatt/demo``.
    """
    root = os.environ.get('MMVISATT_DATA_CACHE')
    if not root:
        root = osp.join(osp.expanduser('~'), '.cache', 'mmvisatt', 'demo')
    return osp.abspath(osp.expanduser(root))


# --------------------------------------------------------------------------
# Scene rendering (shared by both dataset formats)
# --------------------------------------------------------------------------
@dataclass
class _Scene:
    """One rendered image and who owns each pixel.

    ``owner[y, x]`` is the index (into ``labels``) of the topmost object at
    that pixel, or -1 for background.  Keeping the owner map instead of one
    mask per object makes occlusion exact by construction: a later object
    simply takes the pixels over.
    """
    image: np.ndarray  # (H, W, 3) uint8, RGB
    owner: np.ndarray  # (H, W) int16
    labels: List[int]  # class index into DEMO_COCO_CLASSES, per object


def _plain_background(rng: np.random.Generator, size: int) -> np.ndarray:
    base = rng.uniform(60, 195, size=3).astype(np.float32)
    ramp = np.arange(size, dtype=np.float32) / size
    theta = rng.uniform(0, 2 * np.pi)
    grad = np.cos(theta) * ramp[None, :] + np.sin(theta) * ramp[:, None]
    return base + grad[..., None] * rng.uniform(-10, 10, size=3).astype(np.float32)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    # A flat background would let a model find objects by colour alone; smooth
    # noise, gradients and stripes force it to use shape and edges.  They stay
    # of moderate contrast around one base colour, as real scenes mostly are,
    # so that a detector trained from scratch learns in a few minutes.
    base = rng.uniform(60, 195, size=3).astype(np.float32)
    cells = int(rng.integers(3, 9))
    coarse = base + rng.uniform(-35, 35, size=(cells, cells, 3)).astype(
        np.float32)
    img = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
    ramp = np.arange(size, dtype=np.float32) / size
    theta = rng.uniform(0, 2 * np.pi)
    grad = np.cos(theta) * ramp[None, :] + np.sin(theta) * ramp[:, None]
    img += grad[..., None] * rng.uniform(-30, 30, size=3).astype(np.float32)
    if rng.random() < 0.5:
        phi = rng.uniform(0, np.pi)
        period = rng.uniform(0.03, 0.15) * size
        pix = np.arange(size, dtype=np.float32)
        phase = np.cos(phi) * pix[None, :] + np.sin(phi) * pix[:, None]
        stripes = np.sin(2 * np.pi * phase / period)
        img += stripes[..., None] * rng.uniform(5, 15, size=3).astype(
            np.float32)
    return img


def _shape_mask(rng: np.random.Generator, cls: int, size: int,
                style: SceneStyle) -> np.ndarray:
    """Boolean mask of one shape fully inside a ``size`` x ``size`` canvas."""
    extent = max(rng.uniform(style.min_size, style.max_size) * size,
                 _MIN_SIDE_PX)
    mask = np.zeros((size, size), np.uint8)
    scale = 1 << _SHIFT
    if cls == 1:  # circle: extent is the diameter
        r = extent / 2
        cx, cy = rng.uniform(r, size - r, size=2)
        cv2.circle(mask, (int(round(cx * scale)), int(round(cy * scale))),
                   int(round(r * scale)), 1, thickness=-1,
                   lineType=cv2.LINE_8, shift=_SHIFT)
        return mask.astype(bool)
    if cls == 0:  # square: extent is the side
        angle = 0.0 if rng.random() < 0.5 else np.deg2rad(rng.uniform(-30, 30))
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * extent / 2
    else:  # triangle inscribed in a circle of diameter extent
        angle = rng.uniform(0, 2 * np.pi)
        # Jitter of +-20 deg around an equilateral layout keeps every interior
        # angle within 40..80 deg, so the triangle is never a sliver.
        t = np.deg2rad(np.array([0., 120., 240.]) + rng.uniform(-20, 20, 3))
        corners = np.stack([np.cos(t), np.sin(t)], axis=1) * extent / 2
    rot = np.array([[np.cos(angle), -np.sin(angle)],
                    [np.sin(angle), np.cos(angle)]])
    pts = corners @ rot.T
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    offset = rng.uniform(-lo, size - 1 - hi)
    pts = np.round((pts + offset) * scale).astype(np.int32)
    cv2.fillPoly(mask, [pts], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    return mask.astype(bool)


def _has_hole(mask: np.ndarray) -> bool:
    _, hierarchy = cv2.findContours(
        mask.astype(np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    return hierarchy is not None and bool((hierarchy[0, :, 3] >= 0).any())


def _pick_colour(rng: np.random.Generator,
                 under: np.ndarray) -> np.ndarray:
    # Random colours sometimes match the background they land on; taking the
    # most distinct of a few candidates keeps every object visible.
    mean = under.reshape(-1, 3).mean(axis=0)
    candidates = rng.uniform(0, 255, size=(6, 3))
    dist = np.linalg.norm(candidates - mean, axis=1)
    return candidates[int(dist.argmax())].astype(np.float32)


def _render_scene(rng: np.random.Generator, size: int,
                  style: SceneStyle = SCENE_STYLES['textured']) -> _Scene:
    img = (_plain_background if style.background == 'plain' else
           _background)(rng, size)
    owner = np.full((size, size), -1, np.int16)
    labels: List[int] = []
    for _ in range(int(rng.integers(1, style.max_objects + 1))):
        for _ in range(_MAX_PLACEMENT_TRIES):
            cls = int(rng.integers(len(DEMO_COCO_CLASSES)))
            mask = _shape_mask(rng, cls, size, style)
            trial = owner.copy()
            trial[mask] = len(labels)
            # COCO polygons cannot express holes, so an object drawn inside
            # another one would turn the outer object's polygon into a lie
            # (it would cover the inner object too).  Re-place it instead.
            covered = np.unique(owner[mask])
            if not any(_has_hole(trial == j) for j in covered if j >= 0):
                break
        else:
            continue
        img[mask] = _pick_colour(rng, img[mask])
        owner = trial
        labels.append(cls)
    # Fine grain over everything, objects included, so no region is flat.
    img += rng.normal(0, 4, size=img.shape).astype(np.float32)
    image = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return _Scene(image=image, owner=owner, labels=labels)


def _scene_rng(seed: int, split: str, index: int) -> np.random.Generator:
    # One stream per image: image i does not depend on how many images the
    # split has, and train/val never share a scene.
    return np.random.default_rng([seed, _SPLIT_CODES[split], index])


def _visible_instances(
        scene: _Scene) -> List[Tuple[int, np.ndarray, List[List[float]]]]:
    """``(class index, visible mask, polygons)`` of every annotatable object.

    Dropped: objects whose visible part is smaller than 30 px and objects
    without any polygon of 3 or more points.
    """
    kernel = np.ones((3, 3), np.uint8)
    out = []
    for idx, cls in enumerate(scene.labels):
        visible = (scene.owner == idx).astype(np.uint8)
        # Occlusion can leave one-pixel-wide slivers; their polygons are
        # degenerate and they are not meaningful training targets.
        visible = cv2.morphologyEx(visible, cv2.MORPH_OPEN, kernel)
        if int(visible.sum()) < _MIN_VISIBLE_AREA:
            continue
        contours, _ = cv2.findContours(visible, cv2.RETR_EXTERNAL,
                                       cv2.CHAIN_APPROX_SIMPLE)
        # findContours returns pixel indices; +0.5 puts the vertices on pixel
        # centres in COCO's continuous coordinates (pixel i spans [i, i+1)).
        polygons = [(c.reshape(-1).astype(np.float64) + 0.5).tolist()
                    for c in contours if len(c) >= 3]
        if polygons:
            out.append((cls, visible.astype(bool), polygons))
    return out


# --------------------------------------------------------------------------
# Cache handling
# --------------------------------------------------------------------------
def _check_args(num_train: int, num_val: int, img_size: int, seed: int,
                style: str = 'textured') -> Dict[str, int]:
    if style not in SCENE_STYLES:
        raise ValueError(f'style must be one of {sorted(SCENE_STYLES)}, got '
                         f'{style!r}')
    if num_train < 1 or num_val < 1:
        raise ValueError('num_train and num_val must be at least 1, got '
                         f'{num_train} and {num_val}')
    if img_size < 32:
        raise ValueError(f'img_size must be at least 32, got {img_size}')
    if seed < 0:
        raise ValueError(f'seed must be non-negative, got {seed}')
    params = dict(num_train=int(num_train), num_val=int(num_val),
                  img_size=int(img_size), seed=int(seed))
    if style != 'textured':
        # absent for the default, so the caches made before styles existed
        # keep their names and stamps
        params['style'] = style
    return params


def _default_root(kind: str, params: Dict[str, int]) -> str:
    name = f'{kind}_v{_GENERATOR_VERSION}'
    if params != _DEFAULTS:
        # Readable rather than hashed, so a user can tell the caches apart.
        name += ('-train{num_train}-val{num_val}-{img_size}px-seed{seed}'
                 .format(**params))
        if 'style' in params:
            name += f'-{params["style"]}'
    return osp.join(demo_data_root(), name)


def _read_marker(root: str) -> Optional[dict]:
    try:
        with open(osp.join(root, _MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _existing(root: str, stamp: dict) -> bool:
    """Whether ``root`` already holds the requested set (raise on a clash)."""
    found = _read_marker(root)
    if found is None:
        return False
    if found != stamp:
        raise ValueError(
            f'{root} already holds a different demo dataset ({found}, asked '
            f'for {stamp}); delete it or choose another root')
    return True


def _prepare(kind: str, root: Optional[str], params: Dict[str, int],
             write: Callable[[str, Dict[str, int]], None]) -> str:
    root = osp.abspath(root) if root else _default_root(kind, params)
    stamp = dict(kind=kind, version=_GENERATOR_VERSION, **params)
    if _existing(root, stamp):
        return root
    parent = osp.dirname(root)
    os.makedirs(parent, exist_ok=True)
    # A sibling on the same filesystem, so the final rename is atomic.
    # os.mkdir rather than tempfile.mkdtemp: mkdtemp's 0700 mode would make
    # a dataset in a shared folder unreadable to everybody else.
    tmp = osp.join(parent, f'.{osp.basename(root)}.tmp-{os.getpid()}-'
                   f'{uuid.uuid4().hex[:8]}')
    os.mkdir(tmp)
    try:
        write(tmp, params)
        # Written last: its presence is what "complete" means.
        with open(osp.join(tmp, _MARKER), 'w') as f:
            json.dump(stamp, f)
        try:
            os.replace(tmp, root)
        except OSError:
            # Another process (e.g. another rank) got there first.
            if not _existing(root, stamp):
                raise RuntimeError(
                    f'cannot create {root}: it exists but is not a complete '
                    'demo dataset; delete it and retry') from None
    finally:
        if osp.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _style(params: Dict[str, int]) -> SceneStyle:
    return SCENE_STYLES[params.get('style', 'textured')]


def _save_rgb(path: str, image: np.ndarray,
              params: Sequence[int] = ()) -> None:
    if not cv2.imwrite(path, image[..., ::-1], list(params)):
        raise OSError(f'could not write {path}')


# --------------------------------------------------------------------------
# COCO-style instance segmentation set
# --------------------------------------------------------------------------
def _write_coco(out: str, params: Dict[str, int]) -> None:
    os.makedirs(osp.join(out, 'annotations'))
    size = params['img_size']
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(DEMO_COCO_CLASSES)]
    for split in ('train', 'val'):
        os.makedirs(osp.join(out, split))
        images, annotations = [], []
        for index in range(params[f'num_{split}']):
            scene = _render_scene(_scene_rng(params['seed'], split, index),
                                  size, _style(params))
            file_name = f'{index:06d}.png'
            _save_rgb(osp.join(out, split, file_name), scene.image)
            images.append(dict(id=index, file_name=file_name, width=size,
                               height=size))
            for cls, mask, polygons in _visible_instances(scene):
                ys, xs = np.nonzero(mask)
                x0, y0 = int(xs.min()), int(ys.min())
                annotations.append(dict(
                    # COCOeval stores matched ids in a zero-initialised array,
                    # so annotation id 0 would never count as matched.
                    id=len(annotations) + 1,
                    image_id=index,
                    category_id=cls + 1,
                    bbox=[x0, y0, int(xs.max()) - x0 + 1,
                          int(ys.max()) - y0 + 1],
                    area=int(mask.sum()),
                    iscrowd=0,
                    segmentation=polygons))
        info = dict(description='mmvisatt synthetic demo set (COCO format)',
                    version=str(_GENERATOR_VERSION), **params)
        with open(osp.join(out, 'annotations', f'instances_{split}.json'),
                  'w') as f:
            json.dump(dict(info=info, images=images, annotations=annotations,
                           categories=categories), f)


def prepare_demo_coco(root: Optional[str] = None,
                      num_train: int = 200,
                      num_val: int = 50,
                      img_size: int = 256,
                      seed: int = 0,
                      style: str = 'textured') -> str:
    """Generate (once) the synthetic COCO-format instance segmentation set.

    Every image is an RGB ``img_size`` x ``img_size`` PNG: a textured
    background with 1--4 filled squares (axis aligned or rotated by up to
    30 deg), circles and triangles, each 10%--45% of the image side, drawn
    one over the other.  Annotations describe what is *visible*: occluded
    pixels belong to the object on top, one-pixel slivers are removed,
    objects with less than 30 visible pixels are dropped, and a split object
    gets one polygon per part.  ``bbox`` and ``area`` are those of the
    visible mask; ``segmentation`` are polygons through its boundary pixel
    centres.  Image ids equal the file index (``000000.png`` has id 0).

    Layout (mmdet ``CocoDataset`` conventions)::

        <root>/annotations/instances_{train,val}.json
        <root>/{train,val}/000000.png ...

    Args:
        root: Dataset directory.  Defaults to ``<demo_data_root()>/coco_v2``,
            with the arguments appended to the name when they differ from
            the defaults.
        num_train: Number of training images.
        num_val: Number of validation images.
        img_size: Side of the square images in pixels (at least 32).
        seed: Seed of the generator; the same seed gives identical files.
        style: How hard the scenes are, a key of :data:`SCENE_STYLES`.

    Returns:
        The dataset directory.  If it already holds a complete set made with
        the same arguments, it is returned without regenerating anything.
    """
    params = _check_args(num_train, num_val, img_size, seed, style)
    return _prepare('coco', root, params, _write_coco)


# --------------------------------------------------------------------------
# ADE20K-style semantic segmentation set
# --------------------------------------------------------------------------
def _write_ade(out: str, params: Dict[str, int]) -> None:
    size = params['img_size']
    for split, folder in (('train', 'training'), ('val', 'validation')):
        img_dir = osp.join(out, 'images', folder)
        ann_dir = osp.join(out, 'annotations', folder)
        os.makedirs(img_dir)
        os.makedirs(ann_dir)
        for index in range(params[f'num_{split}']):
            scene = _render_scene(_scene_rng(params['seed'], split, index),
                                  size, _style(params))
            # ADE20K stores "class k" as k + 1 (0 = unlabelled).  Background
            # is class 0, the shapes follow; every pixel is labelled,
            # including small or thin visible parts the COCO set drops,
            # because they are visibly that shape in the image.
            lut = np.array([1] + [cls + 2 for cls in scene.labels], np.uint8)
            seg = lut[scene.owner + 1]
            _save_rgb(osp.join(img_dir, f'{index:06d}.jpg'), scene.image,
                      [cv2.IMWRITE_JPEG_QUALITY, 95])
            if not cv2.imwrite(osp.join(ann_dir, f'{index:06d}.png'), seg):
                raise OSError(f'could not write a segmentation map in '
                              f'{ann_dir}')


def prepare_demo_ade(root: Optional[str] = None,
                     num_train: int = 200,
                     num_val: int = 50,
                     img_size: int = 256,
                     seed: int = 0,
                     style: str = 'textured') -> str:
    """Generate (once) the synthetic ADE20K-format semantic segmentation set.

    Same scenes as :func:`prepare_demo_coco` (same seed, same index), saved
    as JPEG (quality 95, like ADE20K) with a single-channel uint8 PNG label
    map each.  Label values follow ADE20K as read with
    ``reduce_zero_label=True``: value ``k`` is class ``k - 1`` of
    :data:`DEMO_ADE_CLASSES`, i.e. 1 = background, 2 = square, 3 = circle,
    4 = triangle.  Value 0 (ignored) is never written: every pixel is
    labelled, object borders included.

    Layout (mmseg ``ADE20KDataset`` conventions)::

        <root>/images/{training,validation}/000000.jpg ...
        <root>/annotations/{training,validation}/000000.png ...

    Note that mmseg's ``ADE20KDataset`` refuses a ``metainfo`` whose classes
    are not ADE20K class names; to get the demo class names, load the set
    with ``type='BaseSegDataset'``, ``img_suffix='.jpg'``,
    ``seg_map_suffix='.png'``, ``reduce_zero_label=True`` and
    ``metainfo=dict(classes=DEMO_ADE_CLASSES)``.

    Args:
        root: Dataset directory.  Defaults to ``<demo_data_root()>/ade_v2``,
            with the arguments appended to the name when they differ from
            the defaults.
        num_train: Number of training images.
        num_val: Number of validation images.
        img_size: Side of the square images in pixels (at least 32).
        seed: Seed of the generator; the same seed gives identical files.
        style: How hard the scenes are, a key of :data:`SCENE_STYLES`.

    Returns:
        The dataset directory.  If it already holds a complete set made with
        the same arguments, it is returned without regenerating anything.
    """
    params = _check_args(num_train, num_val, img_size, seed, style)
    return _prepare('ade', root, params, _write_ade)


# --------------------------------------------------------------------------
# ImageNet-style classification set
# --------------------------------------------------------------------------
def _write_imagenet(out: str, params: Dict[str, int]) -> None:
    os.makedirs(osp.join(out, 'meta'))
    size = params['img_size']
    for split in ('train', 'val'):
        lines = []
        for name in DEMO_COCO_CLASSES:
            os.makedirs(osp.join(out, split, name))
        index = 0
        while len(lines) < params[f'num_{split}']:
            scene = _render_scene(_scene_rng(params['seed'], f'cls_{split}', index), size, _style(params))
            index += 1
            if len(scene.labels) != 1:
                continue  # a shape that could not be placed: no label to give the image
            path = f'{DEMO_COCO_CLASSES[scene.labels[0]]}/{len(lines):06d}.png'
            _save_rgb(osp.join(out, split, path), scene.image)
            lines.append(f'{path} {scene.labels[0]}')
        with open(osp.join(out, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')


def prepare_demo_imagenet(root: Optional[str] = None,
                          num_train: int = 600,
                          num_val: int = 150,
                          img_size: int = 128,
                          seed: int = 0,
                          style: str = 'single') -> str:
    """Generate (once) the synthetic ImageNet-format classification set.

    Every image shows one shape (square, circle or triangle, the classes of
    :data:`DEMO_COCO_CLASSES` in that order) drawn by the scene generator of
    the other sets, from random streams of its own: no image of it is an
    image of the COCO or ADE sets.  Layout (mmpretrain ``ImageNet`` /
    ``CustomDataset`` conventions, class folders and annotation lists)::

        <root>/{train,val}/<class>/000000.png ...
        <root>/meta/{train,val}.txt   ("<class>/000000.png <label>" lines)

    Args and return value as :func:`prepare_demo_coco` (``style`` defaults
    to ``'single'``: one large shape on a plain background).
    """
    params = _check_args(num_train, num_val, img_size, seed, style)
    return _prepare('imagenet', root, params, _write_imagenet)
