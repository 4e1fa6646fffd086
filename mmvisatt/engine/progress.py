"""Hooks that report on a run: evaluation progress (a line per evaluation, a bar while it runs) and a per-rank
trace of the samples, losses and final parameters, for checking a distributed set-up. Registered in mmengine's root
``HOOKS`` so they build under any ``default_scope``."""
import hashlib
import json
import os.path as osp
import sys
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.utils import mkdir_or_exist


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
