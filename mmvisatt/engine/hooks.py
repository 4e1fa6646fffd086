"""Hooks used by the demo run, the distributed checks and the run-time checks of what only the built model can
tell (the neck's input channels, a ``load_from`` backbone in another layout); registered in mmengine's root
``HOOKS`` so they build under any ``default_scope``."""
import hashlib
import json
import os.path as osp
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.utils import mkdir_or_exist

from mmvisatt.checkpoint import CheckpointMismatchError, convert_backbone_layout
from .demo import describe_demo


def _scalars(metrics: Optional[Dict[str, Any]]) -> Dict[str, float]:
    return {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}


@HOOKS.register_module()
class EvalProgressHook(Hook):
    """Validate once before the first iteration and report the first and the last validation side by side.

    The iteration-0 numbers are the baseline that shows whether training learned anything; they are taken after
    weight initialisation, so they describe exactly the model the first iteration starts from. A resumed run
    skips the baseline. The report is logged and written to ``<work_dir>/<out_file>``.

    Args:
        out_file: JSON file name, relative to the work dir.
    """

    priority = 'LOW'

    def __init__(self, out_file: str = 'eval_progress.json') -> None:
        self.out_file = out_file
        self.history: List[Dict[str, Any]] = []

    def before_train(self, runner) -> None:
        if runner.iter == 0 and runner.val_loop is not None:
            print_log('Validating the initial model (iteration 0) as a baseline', logger='current')
            runner.val_loop.run()

    def after_val_epoch(self, runner, metrics: Optional[Dict[str, Any]] = None) -> None:
        self.history.append(dict(iter=runner.iter, metrics=_scalars(metrics)))

    def after_train(self, runner) -> None:
        if not self.history:
            return
        first, last = self.history[0], self.history[-1]
        rows = [f'{k}: {v:.4f} (iter {first["iter"]}) -> {last["metrics"].get(k, float("nan")):.4f} '
                f'(iter {last["iter"]})' for k, v in first['metrics'].items()]
        print_log('Evaluation progress\n  ' + '\n  '.join(rows), logger='current')
        if is_main_process():
            with open(osp.join(runner.work_dir, self.out_file), 'w') as f:
                json.dump(dict(first=first, last=last, history=self.history), f, indent=1)


@HOOKS.register_module()
class EvalProgressBarHook(Hook):
    """A progress bar (with images/s and the time left) over every validation and test run.

    The logger reports an evaluation only every ``interval`` iterations and then sits silent through the metric
    computation; on a long COCO / ADE20K evaluation the bar shows it is moving. Main process only; it counts the
    images of all ranks.
    """

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._bar = None

    def _start(self, runner, loader) -> None:
        if is_main_process():
            from mmengine.dist import get_world_size
            from mmengine.utils import ProgressBar
            # the stdout of now: ProgressBar's default is the one of its import
            self._bar = ProgressBar(len(loader.dataset), file=sys.stdout)
            self._world = get_world_size()
            self._batch = loader.batch_size or 1

    def _step(self) -> None:
        if self._bar is not None:
            for _ in range(self._batch * self._world):
                if self._bar.completed < self._bar.task_num:
                    self._bar.update()

    def _end(self) -> None:
        if self._bar is not None:
            self._bar.file.write('\n')
            self._bar = None

    def before_val_epoch(self, runner) -> None:
        self._start(runner, runner.val_dataloader)

    def before_test_epoch(self, runner) -> None:
        self._start(runner, runner.test_dataloader)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._step()

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._step()

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._end()

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._end()


def _sample_id(data_sample: Any) -> Any:
    meta = data_sample.metainfo if hasattr(data_sample, 'metainfo') else data_sample
    return meta.get('img_id', meta.get('img_path'))


@HOOKS.register_module()
class TrainingTraceHook(Hook):
    """Record, per rank, which samples were trained on, the losses of every iteration and a digest of the final
    parameters.

    Meant for checking a distributed set-up: the ranks of a data-parallel run should see disjoint samples within
    an epoch and end with identical parameters. Writes ``<work_dir>/<out_dir>/rank{R}.json`` with ``sample_ids``
    (COCO ``img_id`` or the image path), ``losses`` (one dict of this rank's logged loss terms per iteration),
    ``param_sha256`` over all parameters in ``named_parameters`` order and ``param_sum``. Enable it without editing
    a config: ``--cfg-options default_hooks.trace.type=TrainingTraceHook``.
    """

    priority = 'VERY_LOW'

    def __init__(self, out_dir: str = 'trace') -> None:
        self.out_dir = out_dir
        self.sample_ids: List[Any] = []
        self.losses: List[Dict[str, float]] = []

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs: Optional[dict] = None) -> None:
        samples: Sequence[Any] = (data_batch or {}).get('data_samples', [])
        self.sample_ids.extend(_sample_id(s) for s in samples)
        self.losses.append({k: float(v) for k, v in (outputs or {}).items()
                            if isinstance(v, (int, float, torch.Tensor)) and 'loss' in k})

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        digest, total = hashlib.sha256(), 0.0
        with torch.no_grad():
            for _, param in model.named_parameters():
                data = param.detach().cpu().contiguous()
                digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
                total += float(data.double().sum())
        out_dir = osp.join(runner.work_dir, self.out_dir)
        mkdir_or_exist(out_dir)
        with open(osp.join(out_dir, f'rank{runner.rank}.json'), 'w') as f:
            json.dump(dict(rank=runner.rank, world_size=runner.world_size, iters=runner.iter,
                           sample_ids=self.sample_ids, losses=self.losses, param_sha256=digest.hexdigest(),
                           param_sum=total), f)


@HOOKS.register_module()
class DemoReportHook(Hook):
    """Before training, one line on what the demo run does (``config_lr``: the config's own lr, which the demo
    replaced); at the end of training, something to look at: the trained model's predictions beside the ground
    truth of the first ``num_images`` validation images, and the training curves, as PNG files in the work dir.

    ``<prefix>_predictions.png`` stacks one row per image, drawn by the config's visualizer: for a detector the
    ground truth on the left and the prediction on the right (boxes, masks, class names and scores above
    ``score_thr``), for a segmentor the two class maps, for a classifier the image with its true and predicted
    class. ``<prefix>_curves.png`` plots the losses and the validation metrics
    (:func:`mmvisatt.analysis.logs.plot_training_log`). Both paths are logged. Main process only.
    """

    priority = 'LOWEST'

    def __init__(self, num_images: int = 4, score_thr: float = 0.3, prefix: str = 'demo',
                 config_lr: Optional[float] = None) -> None:
        self.num_images = num_images
        self.score_thr = score_thr
        self.prefix = prefix
        self.config_lr = config_lr

    def before_train(self, runner) -> None:
        print_log(describe_demo(runner.cfg, self.config_lr), logger='current')

    def after_train(self, runner) -> None:
        if not is_main_process():
            return
        paths = [self._predictions(runner), self._curves(runner)]
        print_log('Demo pictures:\n  ' + '\n  '.join(p for p in paths if p), logger='current')

    def _predictions(self, runner) -> Optional[str]:
        import mmcv
        import numpy as np
        from mmengine.dataset import pseudo_collate
        if runner.val_loop is None:
            print_log('no validation data, so no predictions to draw', logger='current')
            return None
        dataset = runner.val_dataloader.dataset
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        visualizer = runner.visualizer
        visualizer.dataset_meta = dataset.metainfo
        rows = []
        was_training = model.training
        model.eval()
        # through files: mmseg's visualizer keeps only the prediction half as its current image
        with tempfile.TemporaryDirectory() as tmp:
            try:
                for index in range(min(self.num_images, len(dataset))):
                    with torch.no_grad():
                        sample = model.test_step(pseudo_collate([dataset[index]]))[0]
                    image = mmcv.imread(sample.img_path, channel_order='rgb')
                    out_file = osp.join(tmp, f'{index}.png')
                    if 'pred_label' in sample:
                        # mmpretrain's visualizer names its classification drawing apart; a small image is
                        # enlarged so that the label text fits
                        visualizer.visualize_cls(image, sample, classes=dataset.metainfo.get('classes'),
                                                 resize=224, show=False, out_file=out_file)
                    else:
                        kwargs = dict(pred_score_thr=self.score_thr) if 'pred_instances' in sample else {}
                        visualizer.add_datasample(osp.basename(sample.img_path), image, sample, draw_gt=True,
                                                  draw_pred=True, show=False, out_file=out_file, **kwargs)
                    rows.append(mmcv.imread(out_file))
            finally:
                model.train(was_training)
        if not rows:
            return None
        width = max(r.shape[1] for r in rows)
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
        path = osp.join(runner.work_dir, f'{self.prefix}_predictions.png')
        if not mmcv.imwrite(np.concatenate(rows), path):
            raise OSError(f'could not write {path}')
        return path

    def _curves(self, runner) -> Optional[str]:
        from mmvisatt.analysis.logs import LogError, load_training_log, plot_training_log
        try:
            log = load_training_log(runner.work_dir)
        except (LogError, FileNotFoundError) as error:
            print_log(f'no training curves: {error}', logger='current')
            return None
        keys = [k for k in log.train if k == 'loss'] + [k for k in log.val
                                                        if k.endswith(('_mAP', 'mIoU', 'accuracy/top1'))]
        return plot_training_log(log, osp.join(runner.work_dir, f'{self.prefix}_curves.png'), keys=keys or None,
                                 title=osp.basename(osp.abspath(runner.work_dir)))


def _channel_list(value: Any) -> Optional[List[int]]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _path_in_config(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, child in model.named_children():
        if child is module:
            return f'model.{name}'
    return 'model.neck'


@HOOKS.register_module()
class ChannelCheckHook(Hook):
    """At the first forward, check that the neck's ``in_channels`` are what the backbone outputs.

    Raises a ``ValueError`` naming both channel lists and the config key to change instead of the convolution
    shape error mmdet/mmseg would give. Models without a ``backbone`` and a ``neck`` with ``in_channels`` are left
    alone. ``tools/train.py`` / ``tools/test.py`` add it.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._handle = None

    def _install(self, runner) -> None:
        if self._handle is not None:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, neck = getattr(model, 'backbone', None), getattr(model, 'neck', None)
        if isinstance(neck, (list, torch.nn.Sequential)) or neck is None or backbone is None:
            return
        expected = _channel_list(getattr(neck, 'in_channels', None))
        if expected is None:
            return
        key = _path_in_config(model, neck) + '.in_channels'

        def check(module, args, output):
            self._handle.remove()
            outs = output if isinstance(output, (list, tuple)) else [output]
            got = [o.shape[1] for o in outs if isinstance(o, torch.Tensor) and o.dim() >= 2]
            if got != expected:
                indices = getattr(backbone, 'out_indices', None)
                which = f' (out_indices={tuple(indices)})' if indices is not None else ''
                raise ValueError(
                    f'{key}={expected} does not match the backbone: {type(backbone).__name__}{which} outputs '
                    f'{len(got)} feature maps with channels {got}. Set {key}={got} (or change the backbone\'s '
                    f'arch / out_indices).')

        self._handle = backbone.register_forward_hook(check)

    def before_train(self, runner) -> None:
        self._install(runner)

    def before_val(self, runner) -> None:
        self._install(runner)

    def before_test(self, runner) -> None:
        self._install(runner)


@HOOKS.register_module()
class BackboneLayoutHook(Hook):
    """Convert the backbone of a ``load_from`` checkpoint whose backbone is in another layout a converter knows (a
    whole mmdet Swin detector for ReSwin), and refuse one whose backbone fits neither way.

    mmengine loads ``load_from`` with ``strict=False``: without this the backbone of such a file would silently stay
    at its initialisation while the neck and heads load. ``tools/train.py`` adds it.
    """

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, state = getattr(model, 'backbone', None), checkpoint.get('state_dict')
        if not isinstance(backbone, torch.nn.Module) or not isinstance(state, dict):
            return
        source = runner.cfg.get('load_from') or 'the checkpoint'
        if not any(k.startswith(('backbone.', 'module.backbone.')) for k in state):
            raise CheckpointMismatchError(
                f"{source} has no 'backbone.' weights (first keys: {', '.join(list(state)[:4])}): the backbone would "
                f"stay at its initialisation. An ImageNet checkpoint of the backbone goes in its init_cfg "
                f"(--cfg-options model.backbone.init_cfg.checkpoint=PATH), not in load_from.")
        try:
            converted = convert_backbone_layout(state, backbone.state_dict().keys())
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(f'{source}: {error}') from None
        if converted is not None:
            checkpoint['state_dict'], family, layout = converted
            print_log(f'{source}: backbone weights converted from the {layout} layout ({family} converter) for '
                      f'{type(backbone).__name__}.', logger='current')
