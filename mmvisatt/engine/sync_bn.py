"""Synchronized batch norm for CPU process groups (gloo).

``torch.nn.SyncBatchNorm`` and mmcv's ``MMSyncBN`` run on GPUs only, so a CPU data-parallel run used to replace
``SyncBN`` by ``BN``: every process then normalised with the statistics of its own few images, a different model
from the one the config describes (and from a single process with the same total batch). :class:`CPUSyncBatchNorm`
computes the statistics over the whole distributed batch with two all-reduces per layer (mean, then the centred
sum of squares, as a single-process BN does), and back-propagates through them. ``tools/train.py`` uses it for
``SyncBN`` / ``MMSyncBN`` in CPU distributed runs; outside a process group it is a plain BN.
"""
import torch
import torch.distributed as dist
from mmengine.registry import MODELS
from torch.distributed.nn.functional import all_reduce
from torch.nn.modules.batchnorm import _BatchNorm


@MODELS.register_module('CPUSyncBN')
class CPUSyncBatchNorm(_BatchNorm):
    """Batch norm over all processes of the default process group; any input of shape ``(N, C, *)``.

    Parameter and buffer names are those of ``BatchNorm2d`` / ``SyncBatchNorm``, so checkpoints move freely
    between them.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f'CPUSyncBatchNorm expects an input of shape (N, C, *), got {tuple(input.shape)}')

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training or not self.track_running_stats) or not dist.is_available() or \
                not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(input)
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() // input.shape[1]], dtype=input.dtype, device=input.device)
        total = all_reduce(torch.cat([input.sum(dims), count]))
        n = total[-1]
        mean = total[:-1] / n
        shape = [1, -1] + [1] * (input.dim() - 2)
        centred = input - mean.reshape(shape)
        var = all_reduce(centred.pow(2).sum(dims)) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                unbiased = var.detach() * n / (n - 1).clamp(min=1)
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out


__all__ = ['CPUSyncBatchNorm']
