"""Inference with pictures: run a trained detector or segmentor on image files and draw what it predicts.

mmdet's ``DetInferencer`` and mmseg's ``MMSegInferencer`` do the work, chosen by the config's ``default_scope``.
This module prepares the config the way a trained checkpoint needs it and guards the two ways a stock inferencer
silently produces nonsense:

- a checkpoint that does not fit the model (for example one trained with ``tools/train.py CONFIG --demo``, whose
  heads predict the demo's 3 classes, loaded into the 80-class COCO model) is loaded non-strictly, with a warning,
  leaving randomly initialised heads. Here it is refused with the mismatching keys and the likely fix.
- a checkpoint without ``meta.dataset_meta`` gets COCO (mmdet) or Cityscapes (mmseg) class names whatever the
  model predicts. Here the class names then come from the config's test dataset.

Class names are those the training run stored in the checkpoint's ``meta.dataset_meta``. The backbone's
``init_cfg`` is dropped: the trained weights come from the checkpoint, and the ImageNet file the config names need
not exist where inference runs.
"""
import argparse
import copy
import importlib
import logging
import os
import os.path as osp
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np
import torch
from mmengine.config import Config, DictAction
from mmengine.logging import print_log

from mmvisatt.checkpoint import UnsafeCheckpointError
from mmvisatt.checkpoint.fit import classes_hint, drop_pretrained_init, weights_fit_problem
from mmvisatt.checkpoint.loading import abbreviate
from mmvisatt.datasets.transforms import image_truncation, truncated_image_message
from mmvisatt.engine.demo import to_demo_config
from mmvisatt.engine.entrypoints import import_task_library
from mmvisatt.engine.preflight import InferenceError, check_infer

#: File name endings read as images when a folder is given.
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp', '.ppm', '.pgm')
#: default_scope -> what the predictions are
TASKS = {'mmdet': 'detection', 'mmseg': 'segmentation'}


@dataclass
class Prediction:
    """What :meth:`Predictor.run` wrote for one image.

    ``summary``: for detection, ``(class name, score)`` of every detection above the score threshold (the ones
    drawn), best first; for segmentation, ``(class name, fraction of the image's pixels)`` of every predicted
    class, largest first.
    """
    image: str
    out_file: str
    summary: List[Tuple[str, float]]


def collect_images(inputs: Union[str, Sequence[str]]) -> List[str]:
    """Image files named by ``inputs``: files, or folders whose images (by extension) are taken in name order."""
    if isinstance(inputs, str):
        inputs = [inputs]
    images: List[str] = []
    for path in inputs:
        if osp.isdir(path):
            found = sorted(osp.join(path, name) for name in os.listdir(path)
                           if name.lower().endswith(IMAGE_EXTENSIONS) and osp.isfile(osp.join(path, name)))
            if not found:
                raise InferenceError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) in folder {path}')
            images.extend(found)
        elif osp.isfile(path):
            if not path.lower().endswith(IMAGE_EXTENSIONS):
                raise InferenceError(f'{path} is not an image file (expected one of {", ".join(IMAGE_EXTENSIONS)})')
            images.append(path)
        elif '://' in path:
            raise InferenceError(f'{path} is a URL: tools/infer.py reads local files only. Download the image first '
                                 f'(curl -LO {path}, or wget {path}) and pass the file.')
        else:
            raise FileNotFoundError(f'image or folder not found: {path}')
    if not images:
        raise InferenceError('no images given')
    return images


def unreadable_image(path: str) -> Optional[str]:
    """Why ``path`` cannot be predicted on (empty, a macOS metadata file, truncated, not decodable), else None."""
    if osp.basename(path).startswith('._'):
        return ('a macOS metadata file (AppleDouble, written beside the real file when copying from a Mac), not an '
                'image; delete the ._* files')
    if osp.getsize(path) == 0:
        return 'an empty file (0 bytes): the copy or download did not finish'
    truncated = image_truncation(path)
    if truncated:
        return truncated_image_message(path, truncated)
    if cv2.imread(path, cv2.IMREAD_UNCHANGED) is None:
        return 'OpenCV cannot decode it: not an image, or a damaged one'
    return None


def output_names(images: Sequence[str]) -> List[str]:
    """``<image stem>.png`` per image; a stem seen before gets ``_1``, ``_2``, ... so no output overwrites another."""
    names, seen = [], set()
    for image in images:
        stem = osp.splitext(osp.basename(image))[0]
        name, n = f'{stem}.png', 0
        while name in seen:
            n += 1
            name = f'{stem}_{n}.png'
        seen.add(name)
        names.append(name)
    return names


def inference_config(config: Union[str, Config], demo: bool = False,
                     cfg_options: Optional[Dict[str, Any]] = None) -> Config:
    """The config to build the trained model and its test pipeline from.

    ``demo``: the checkpoint was trained with ``tools/train.py CONFIG --demo`` (the demo's classes, image size and
    test settings). ``cfg_options`` apply after it, as in ``tools/train.py``. ``Pretrained`` initialisations are
    dropped and annotation loading is taken out of the test pipeline (images to predict have no annotations).
    The checked image loader becomes mmcv's ``LoadImageFromFile``, which the inferencers look for to put their own
    loader in its place (:class:`Predictor` checks each image file itself).
    """
    if isinstance(config, str):
        if not osp.isfile(config):
            raise FileNotFoundError(f'config not found: {config}')
        cfg = Config.fromfile(config)
    else:
        cfg = copy.deepcopy(config)
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise InferenceError(f"inference supports detection (default_scope='mmdet') and segmentation ('mmseg') "
                             f'configs, got default_scope={scope!r}')
    # before the demo transform, which would otherwise announce a random initialisation
    drop_pretrained_init(cfg.model)
    if demo:
        to_demo_config(cfg, train=False)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
        drop_pretrained_init(cfg.model)
    if cfg.get('visualizer'):
        # drawings are returned, not logged: without a save_dir the backends only warn
        cfg.visualizer.pop('vis_backends', None)
    pipeline = (cfg.get('test_dataloader') or {}).get('dataset', {}).get('pipeline')
    if not pipeline:
        raise InferenceError('the config has no test_dataloader.dataset.pipeline to prepare images with')
    pipeline = [t for t in pipeline if not str(t['type']).endswith('LoadAnnotations')]
    for step in pipeline:
        if str(step['type']).split('.')[-1] == 'LoadCheckedImageFromFile':
            step['type'] = 'LoadImageFromFile'
    cfg.test_dataloader.dataset.pipeline = pipeline
    return cfg


def check_weights_fit(model: torch.nn.Module, checkpoint: dict, hint: str = '') -> None:
    """Raise :class:`InferenceError` unless ``checkpoint`` has a tensor of the right shape for every model key."""
    problem = weights_fit_problem(model, checkpoint, hint)
    if problem:
        raise InferenceError(problem)


def config_dataset_meta(cfg: Config, scope: str) -> dict:
    """Class names (and palette) of the config's test dataset, read without loading its annotations."""
    datasets = importlib.import_module(f'{scope}.registry').DATASETS
    dataset_cfg = copy.deepcopy(cfg.test_dataloader.dataset)
    dataset_cfg['lazy_init'] = True
    return dict(datasets.build(dataset_cfg).metainfo)


def _inferencer_class(scope: str, demo: bool) -> type:
    if scope == 'mmdet':
        from mmdet.apis import DetInferencer as Base
    else:
        from mmseg.apis import MMSegInferencer as Base

    class CheckedInferencer(Base):
        """The library's inferencer, refusing a checkpoint that does not fit and never inventing class names."""

        def _load_weights_to_model(self, model, checkpoint, cfg):
            check_weights_fit(model, checkpoint, classes_hint(checkpoint, demo))
            meta = checkpoint.setdefault('meta', {})
            if 'dataset_meta' not in meta:
                meta['dataset_meta'] = config_dataset_meta(cfg, scope)
                print_log('the checkpoint stores no dataset_meta: class names are those of the config\'s test '
                          'dataset', logger='current')
            super()._load_weights_to_model(model, checkpoint, cfg)

    return CheckedInferencer


class Predictor:
    """A trained detector or segmentor ready to draw its predictions on images.

    Args:
        config: config file (or loaded config) the checkpoint was trained with.
        checkpoint: checkpoint file written by ``tools/train.py`` (or any mm checkpoint of the config's model).
        device: ``cpu``, ``cuda``, ``cuda:1``...; default: CUDA when available.
        demo: the checkpoint was trained with ``tools/train.py CONFIG --demo``.
        cfg_options: config overrides applied after ``demo``.
    """

    def __init__(self, config: Union[str, Config], checkpoint: str, device: Optional[str] = None,
                 demo: bool = False, cfg_options: Optional[Dict[str, Any]] = None) -> None:
        checkpoint = check_infer(checkpoint, device)
        self.cfg = inference_config(config, demo=demo, cfg_options=cfg_options)
        self.scope = import_task_library(self.cfg)
        self.task = TASKS[self.scope]
        self.inferencer = _inferencer_class(self.scope, demo)(model=self.cfg, weights=checkpoint, device=device,
                                                              scope=self.scope)
        self.inferencer.show_progress = False

    @property
    def classes(self) -> Tuple[str, ...]:
        """The class names predictions are labelled with."""
        return tuple(self.inferencer.model.dataset_meta['classes'])

    def predict(self, image: str, score_thr: float = 0.3) -> Tuple[np.ndarray, List[Tuple[str, float]]]:
        """The drawn prediction (H x W x 3 RGB, the image's size) and the summary of :class:`Prediction`.

        ``score_thr``: only detections scoring above it are drawn and listed (detection only).
        """
        if self.task == 'detection':
            result = self.inferencer(image, return_vis=True, no_save_vis=True, pred_score_thr=score_thr)
            pred = result['predictions'][0]
            summary = sorted(((self.classes[label], float(score)) for label, score in zip(pred['labels'],
                              pred['scores']) if score > score_thr), key=lambda item: -item[1])
        else:
            result = self.inferencer(image, return_vis=True)
            seg = np.asarray(result['predictions'])
            labels, counts = np.unique(seg, return_counts=True)
            summary = sorted(((self.classes[int(label)], count / seg.size) for label, count in zip(labels, counts)),
                             key=lambda item: -item[1])
        vis = result['visualization']
        return (vis[0] if isinstance(vis, list) else vis), summary

    def run(self, images: Union[str, Sequence[str]], out_dir: str, score_thr: float = 0.3) -> List[Prediction]:
        """Draw the predictions on ``images`` (files or folders) as ``out_dir/<image stem>.png``."""
        import mmcv
        if not 0 <= score_thr <= 1:
            raise InferenceError(f'--score-thr must be in [0, 1], got {score_thr}')
        paths = collect_images(images)
        results = []
        skipped = []
        for path, name in zip(paths, output_names(paths)):
            problem = unreadable_image(path)
            if problem:
                print_log(f'skipped {path}: {problem}', logger='current', level=logging.WARNING)
                skipped.append(path)
                continue
            vis, summary = self.predict(path, score_thr)
            out_file = osp.join(out_dir, name)
            if not mmcv.imwrite(np.ascontiguousarray(vis[..., ::-1]), out_file):
                raise OSError(f'could not write {out_file}')
            results.append(Prediction(image=path, out_file=out_file, summary=summary))
        if skipped and not results:
            raise InferenceError(f'none of the {len(skipped)} images could be read ({abbreviate(skipped, 4)}); '
                                 f'the log above says why for each')
        if skipped:
            print_log(f'{len(skipped)} of {len(paths)} files were skipped, each named above: '
                      f'{abbreviate(skipped, 4)}', logger='current', level=logging.WARNING)
        return results


def format_prediction(prediction: Prediction, top: int = 5) -> str:
    """One line per image: where the drawing went and the best few classes."""
    parts = [f'{name} {value:.2f}' for name, value in prediction.summary[:top]]
    if len(prediction.summary) > top:
        parts.append(f'... ({len(prediction.summary)} in all)')
    return f'{prediction.image} -> {prediction.out_file}: ' + (', '.join(parts) or 'nothing above --score-thr')


def parse_infer_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Draw the predictions of a trained detector (boxes, masks, class names) or segmentor (colour '
                    'overlay) on images, as PNG files')
    parser.add_argument('images', nargs='+', metavar='IMAGES',
                        help=f'image files and/or folders (their {"/".join(e[1:] for e in IMAGE_EXTENSIONS)} '
                             'files, in name order)')
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='checkpoint file (e.g. work_dirs/NAME/iter_N.pth)')
    parser.add_argument('--out', required=True, metavar='DIR', help='where <image name>.png drawings are written')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: draw and list the detections scoring above this (default 0.3)')
    parser.add_argument('--device', help='cpu, cuda, cuda:1, ... (default: CUDA when available)')
    parser.add_argument('--demo', action='store_true',
                        help='the checkpoint was trained with tools/train.py CONFIG --demo (demo classes and sizes)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings (applied after --demo), as in tools/train.py')
    return parser.parse_args(argv)


def infer_main(argv: Optional[Sequence[str]] = None) -> List[Prediction]:
    args = parse_infer_args(argv)
    collect_images(args.images)  # a wrong path fails before the model is built
    predictor = Predictor(args.config, args.checkpoint, device=args.device, demo=args.demo,
                          cfg_options=args.cfg_options)
    predictions = predictor.run(args.images, args.out, score_thr=args.score_thr)
    for prediction in predictions:
        print(format_prediction(prediction))
    return predictions


def run_infer_tool(argv: Optional[Sequence[str]] = None) -> None:
    """``tools/infer.py``: a mistake the user can fix ends the command with its message, not a traceback."""
    try:
        infer_main(argv)
    except (InferenceError, FileNotFoundError, UnsafeCheckpointError) as error:
        sys.exit(f'error: {error}')


__all__ = ['IMAGE_EXTENSIONS', 'InferenceError', 'Prediction', 'Predictor', 'collect_images', 'unreadable_image',
           'output_names', 'drop_pretrained_init', 'inference_config', 'check_weights_fit', 'config_dataset_meta',
           'format_prediction', 'parse_infer_args', 'infer_main', 'run_infer_tool']
