"""Detection heads for mmdet configs (imports mmdet; listed in ``custom_imports`` of the detection runtime).

``SyncAvgRetinaHead`` is RetinaNet's head with the loss normaliser averaged over processes. mmdet's ``RetinaHead``
divides each process's loss by the positive anchors of *its own* images, so two processes optimise
``(L0 / n0 + L1 / n1) / 2`` where one process with the same images optimises ``(L0 + L1) / (n0 + n1)``: the same
terms weighted differently, so a distributed run is not the single-process run split in two. mmdet's ATSS, FCOS
and GFL heads average the normaliser over processes (``reduce_mean``); this head does the same for RetinaNet.
In a single process it is ``RetinaHead`` exactly, and its parameters and state dict keys are RetinaHead's.
"""
import torch
from mmdet.models.dense_heads import RetinaHead
from mmdet.utils import reduce_mean
from mmengine.registry import MODELS


@MODELS.register_module()
class SyncAvgRetinaHead(RetinaHead):
    """``RetinaHead`` whose ``avg_factor`` (positive anchors of the batch) is the mean over processes.

    DDP averages gradients over the ``W`` processes, so with ``n_r`` positives on rank ``r`` each rank dividing by
    ``sum(n) / W`` gives ``sum(L) / sum(n)``: the normalisation of one process holding the whole batch.
    """

    def get_targets(self, *args, **kwargs) -> tuple:
        targets = super().get_targets(*args, **kwargs)
        # (labels, label_weights, bbox_targets, bbox_weights, avg_factor, *optional extras)
        labels, avg_factor = targets[0], targets[4]
        synced = reduce_mean(torch.tensor(float(avg_factor), device=labels[0].device)).item()
        return targets[:4] + (synced, ) + targets[5:]


__all__ = ['SyncAvgRetinaHead']
