"""Stop a training run at the first non-finite loss instead of letting NaN spread silently into the weights.

mmengine updates the parameters with whatever loss the model returns; one NaN or Inf turns every weight into NaN
and the run goes on logging ``nan`` and saving NaN checkpoints. :class:`NonFiniteGuardHook` checks the loss before
the optimizer steps with it (all ranks agree on the verdict, so a distributed run never hangs half-way through a
step) and either raises :class:`NonFiniteLossError`, naming the iteration, the loss terms and the images, or skips
the update. It is on by default in the runtime bases (``configs/_base_/default_runtime_{det,seg,cls}.py``).

The check adds no host sync of its own before the backward: the verdict is computed on the loss's device (and
all-reduced there) when the loss is made, and read back only at the step, once the backward is enqueued. Under
AMP it is read after the step, whose loss scaler has already read back its own inf check (and skips any update
whose gradients a non-finite loss made non-finite); in float32 it is read just before the optimizer steps, where
``clip_grad`` reads back the gradient norm too.
"""
import functools
import math
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as torch_dist
from mmengine.dist import all_gather_object, get_rank, is_distributed
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.registry import HOOKS

ACTIONS = ('raise', 'skip')


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


def _image_names(data_batch: Any) -> List[str]:
    samples = data_batch.get('data_samples', []) if isinstance(data_batch, dict) else []
    names = []
    for sample in samples or []:
        meta = sample.metainfo if hasattr(sample, 'metainfo') else {}
        name = meta.get('img_path', meta.get('img_id'))
        if name is not None:
            names.append(str(name))
    return names


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """Check every training loss before the parameters are updated with it.

    Args:
        action: ``'raise'`` (default): stop with :class:`NonFiniteLossError` saying at which iteration which loss
            terms were non-finite, on which images, and what to try; no update is made with that loss and no later
            checkpoint is written. ``'skip'``: drop the update (gradients are computed, so distributed processes
            stay in step, then zeroed; with gradient accumulation the partial sum is dropped too), log a warning
            and go on.
        max_consecutive_skips: with ``'skip'``, raise after this many non-finite iterations in a row: the model is
            diverging, not meeting one bad batch.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, action: str = 'raise', max_consecutive_skips: int = 10) -> None:
        if action not in ACTIONS:
            raise ValueError(f'NonFiniteGuardHook: action must be one of {ACTIONS}, got {action!r}')
        self.action = action
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped: List[int] = []
        self._consecutive = 0
        self._log_vars: Dict[str, Any] = {}
        self._images: List[str] = []
        self._runner: Any = None
        self._restore: List[Any] = []
        self._finite: Optional[torch.Tensor] = None  # the verdict on the losses since the last step, on device

    def before_train(self, runner) -> None:
        optim_wrapper = runner.optim_wrapper
        if not isinstance(optim_wrapper, OptimWrapper):
            print_log(f'NonFiniteGuardHook: {type(optim_wrapper).__name__} is not an OptimWrapper; losses are not '
                      'checked', logger='current', level=30)
            return
        self._runner = runner
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        for owner, name, wrapper in ((model, 'parse_losses', self._parse_losses),
                                     (optim_wrapper, 'update_params', self._update_params),
                                     (optim_wrapper, 'step', self._step)):
            original = getattr(owner, name)
            self._restore.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, functools.partial(wrapper, original))

    def after_train(self, runner) -> None:
        for owner, name, previous in reversed(self._restore):
            if previous is None:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self._restore.clear()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._images = _image_names(data_batch)
        self._log_vars = {}

    def _parse_losses(self, parse_losses, losses):
        loss, log_vars = parse_losses(losses)
        self._log_vars = log_vars  # read only when something is wrong: no per-iteration device sync
        return loss, log_vars

    def _finite_flag(self, loss: torch.Tensor) -> torch.Tensor:
        """Whether ``loss`` is finite on every rank, as a tensor on the loss's device: nothing is read back."""
        finite = torch.isfinite(loss.detach()).all()
        if is_distributed():
            flag = finite.to(torch.int32).reshape(1)
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN)
            finite = flag[0].bool()
        return finite

    def _describe(self) -> str:
        runner = self._runner
        terms = {k: float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else float(v)
                 for k, v in self._log_vars.items() if 'loss' in k}
        report = dict(rank=get_rank(), terms=terms, images=self._images)
        reports = all_gather_object(report) if is_distributed() else [report]
        lines = []
        for r in reports:
            bad = [k for k, v in r['terms'].items() if isinstance(v, float) and not math.isfinite(v)
                   and k != 'loss']
            if not bad and not all(isinstance(v, float) and math.isfinite(v) for v in r['terms'].values()):
                bad = ['loss']
            if bad:
                where = f' on rank {r["rank"]}' if len(reports) > 1 else ''
                values = ', '.join(f'{k}={r["terms"][k]}' for k in bad)
                images = ', '.join(r['images']) or 'unknown'
                lines.append(f'{values}{where} (images: {images})')
        epoch = f', epoch {runner.epoch + 1}' if getattr(runner.train_loop, 'max_epochs', 1) > 1 else ''
        return f'iteration {runner.iter + 1}{epoch}: ' + ('; '.join(lines) or 'non-finite total loss')

    def _update_params(self, update_params, loss: torch.Tensor, *args, **kwargs):
        finite = self._finite_flag(loss)
        # with gradient accumulation the step uses every loss since the last one
        self._finite = finite if self._finite is None else self._finite & finite
        return update_params(loss, *args, **kwargs)

    def _step(self, step, *args, **kwargs):
        finite, self._finite = self._finite, None
        if finite is None:  # a step outside update_params: nothing was checked
            return step(*args, **kwargs)
        if hasattr(self._runner.optim_wrapper, 'loss_scaler'):
            # AMP: the scaler reads its inf check back and skips the update; reading ours after it adds no wait
            result = step(*args, **kwargs)
            if not bool(finite):
                self._non_finite()
            else:
                self._consecutive = 0
            return result
        if bool(finite):
            self._consecutive = 0
            return step(*args, **kwargs)
        self._non_finite()
        return None

    def _non_finite(self) -> None:
        """The step's loss was not finite and the optimizer did not step with it: skip (``update_params`` zeroes
        the gradients next) or raise."""
        what = self._describe()
        runner = self._runner
        if self.action == 'skip' and self._consecutive < self.max_consecutive_skips:
            self._consecutive += 1
            self.skipped.append(runner.iter + 1)
            print_log(f'NonFiniteGuardHook: skipped the update of {what}', logger='current', level=30)
            return
        ckpt = runner.message_hub.get_info('last_ckpt')
        lines = [f'Non-finite loss at {what}.',
                 'The parameters were not updated with it' + (f'; the last checkpoint is {ckpt}.' if ckpt else '.')]
        if self.action == 'skip':
            lines.append(f'{self._consecutive} iterations in a row were non-finite before this one: the model has '
                         'diverged.')
        lines += ['To fix: lower the learning rate (optim_wrapper.optimizer.lr) or lengthen the warmup, clip '
                  'gradients (optim_wrapper.clip_grad=dict(max_norm=...)), check the annotations of these images '
                  '(empty or degenerate boxes/masks), or, to step over rare bad batches, use '
                  "NonFiniteGuardHook(action='skip') in custom_hooks."]
        raise NonFiniteLossError('\n'.join(lines))


__all__ = ['NonFiniteGuardHook', 'NonFiniteLossError']
