"""Exact resume from a checkpoint written inside an epoch, for epoch-based training.

mmengine's ``EpochBasedTrainLoop`` restarts an interrupted epoch from its first batch: the work since the epoch
began is repeated, those images are seen twice, and the run is not the one an uninterrupted run gives. Here:

* :class:`ResumableEpochBasedTrainLoop` (the epoch-based configs' ``train_cfg.type``) continues a resumed epoch at
  the batch after the checkpointed one. Its batch sampler (:class:`ResumableBatchSampler`, wrapped around the
  config's own, e.g. mmdet's ``AspectRatioBatchSampler``, or around the plain batching of ``DefaultSampler``)
  passes over the consumed batches by index only, so none of their images is loaded.
* Random augmentation draws from a seed of its own per sample (config seed, epoch, dataset index;
  :class:`SeededSamples`), not from the stream of whichever dataloader worker happens to load the image, so what a
  batch looks like does not depend on which batches came before it in a worker: the one thing a skip cannot
  reproduce.
* The data layout of the epoch (processes, batch per process, batches per epoch) travels in the checkpoint's
  message hub; a mid-epoch checkpoint resumed under another layout is refused (:class:`MidEpochResumeError`),
  since the batches already consumed cannot be told apart under it.

The checkpoints themselves come from ``AtomicCheckpointHook(mid_epoch_interval=N)`` and the random states of the
main process from ``ExactResumeHook`` (docs/reliability.md).
"""
import copy
import random
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.dist import get_world_size
from mmengine.registry import DATA_SAMPLERS, DATASETS, LOOPS
from mmengine.runner import EpochBasedTrainLoop
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from .reliability import set_rng_states

# message hub key of the epoch's data layout (saved with every checkpoint)
POSITION_KEY = 'mid_epoch_position'


class MidEpochResumeError(ValueError):
    """A mid-epoch checkpoint resumed under a data layout in which its consumed batches cannot be identified."""


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's random augmentation: a function of the config seed, the epoch and the index only."""
    return int(np.random.SeedSequence([seed % 2**63, epoch, index]).generate_state(1)[0])


@DATASETS.register_module()
class SeededSamples(Dataset):
    """A dataset whose items, asked for as ``(index, seed)``, run their pipeline with Python, numpy and torch seeded
    by ``seed``; the caller's random states are left as they were. A plain index passes through unseeded.

    Attributes the wrapped dataset has (``metainfo``, ``get_data_info``, ...) are read through.
    """

    def __init__(self, dataset: Union[Dataset, dict]) -> None:
        self.dataset = DATASETS.build(dataset) if isinstance(dataset, dict) else dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == 'dataset':  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: Union[int, Tuple[int, int]]) -> Any:
        if not isinstance(key, tuple):
            return self.dataset[key]
        index, seed = key
        py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            return self.dataset[index]
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.set_rng_state(torch_state)


@DATA_SAMPLERS.register_module()
class ResumableBatchSampler(BatchSampler):
    """Batches of ``batch_sampler`` (a config, built over ``sampler``; None: plain batches of ``batch_size``), as
    ``(index, sample_seed)`` pairs for :class:`SeededSamples`; :meth:`start_epoch` can make the next pass begin
    after its first ``skip`` batches, which are drawn from the inner sampler (indices and image sizes only) and
    dropped."""

    def __init__(self, sampler: Sampler, batch_size: int, drop_last: bool = False,
                 batch_sampler: Optional[dict] = None) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        if batch_sampler is None:
            self.batch_sampler: Any = BatchSampler(sampler, batch_size, drop_last)
        else:
            self.batch_sampler = DATA_SAMPLERS.build(batch_sampler,
                                                     default_args=dict(sampler=sampler, batch_size=batch_size))
        self.epoch, self.seed, self._skip = 0, 0, 0

    def start_epoch(self, epoch: int, seed: int, skip: int = 0) -> None:
        self.epoch, self.seed, self._skip = epoch, seed, skip

    def __iter__(self) -> Iterator[List[Tuple[int, int]]]:
        skip, self._skip = self._skip, 0
        for i, batch in enumerate(self.batch_sampler):
            if i >= skip:
                yield [(index, sample_seed(self.seed, self.epoch, index)) for index in batch]

    def __len__(self) -> int:
        return len(self.batch_sampler)


def resumable_dataloader(cfg: dict) -> dict:
    """A copy of the dataloader config ``cfg`` with its dataset in :class:`SeededSamples` and its batching in
    :class:`ResumableBatchSampler` (around the config's ``batch_sampler``, if any)."""
    cfg = copy.deepcopy(cfg)
    batching = dict(type='ResumableBatchSampler', drop_last=cfg.pop('drop_last', False),
                    batch_sampler=cfg.pop('batch_sampler', None))
    # item assignment, not update(): ConfigDict.update merges into the dict already there
    cfg['dataset'] = dict(type='SeededSamples', dataset=cfg['dataset'])
    cfg['batch_sampler'] = batching
    return cfg


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """mmengine's ``EpochBasedTrainLoop`` (same arguments) that resumes a checkpoint from inside an epoch at the next
    batch of that epoch, without loading the images of the batches before it (see the module's docstring).

    An epoch-end checkpoint, or a run started afresh, behaves as with ``EpochBasedTrainLoop``, apart from where
    random augmentation draws its numbers (per sample instead of per worker).
    """

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], *args, **kwargs) -> None:
        if isinstance(dataloader, dict):
            dataloader = resumable_dataloader(dataloader)
        super().__init__(runner, dataloader, *args, **kwargs)
        if not isinstance(self.dataloader.batch_sampler, ResumableBatchSampler):
            raise TypeError('ResumableEpochBasedTrainLoop builds its dataloader from a config; got a built '
                            f'DataLoader with a {type(self.dataloader.batch_sampler).__name__}')
        self._skip = 0
        # set by ExactResumeHook: the random states the checkpointed run had right after it started this epoch's
        # dataloader iterator (which draws a seed from the main process's generator)
        self.rng_states_after_iterator: Optional[Dict[str, Any]] = None

    def layout(self) -> Dict[str, int]:
        return dict(world_size=get_world_size(), batch_size=self.dataloader.batch_sampler.batch_size,
                    batches=len(self.dataloader))

    def resumed_batches(self) -> int:
        """How many batches of the current epoch the checkpoint this run resumed from had consumed (0 at an epoch
        boundary or without a resume); refuses a layout under which they cannot be skipped."""
        hub = self.runner.message_hub
        position = hub.get_info(POSITION_KEY) if POSITION_KEY in hub.runtime_info else None
        if not position or position['epoch'] != self._epoch or self._iter <= position['start_iter']:
            return 0
        done = self._iter - position['start_iter']
        saved, now = {k: position[k] for k in ('world_size', 'batch_size', 'batches')}, self.layout()
        if saved != now:
            fallback = (f'from the checkpoint of the last finished epoch (epoch_{self._epoch}.pth), which resumes '
                        'under any layout' if self._epoch else 'start afresh (no epoch had finished)')
            raise MidEpochResumeError(
                f'--resume: the checkpoint was written inside epoch {self._epoch + 1}, after {done} of its '
                f'{saved["batches"]} batches, by {saved["world_size"]} process(es) with {saved["batch_size"]} '
                f'images each; this run has {now["world_size"]} x {now["batch_size"]} ({now["batches"]} batches '
                'per epoch), under which the batches already trained on cannot be told apart. Resume with the '
                f'same number of processes and batch size (and the same data), or {fallback}.')
        return done

    def run(self) -> torch.nn.Module:
        self._skip = self.resumed_batches()
        return super().run()

    def run_epoch(self) -> None:
        skip, self._skip = self._skip, 0
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        self.runner.message_hub.update_info(POSITION_KEY, dict(epoch=self._epoch, start_iter=self._iter - skip,
                                                               **self.layout()))
        self.dataloader.batch_sampler.start_epoch(self._epoch, self.runner.seed, skip)
        batches = iter(self.dataloader)
        if self.rng_states_after_iterator is not None:
            set_rng_states(self.rng_states_after_iterator)
            self.rng_states_after_iterator = None
        for idx, data_batch in enumerate(batches, start=skip):
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1


__all__ = ['POSITION_KEY', 'MidEpochResumeError', 'sample_seed', 'SeededSamples', 'ResumableBatchSampler',
           'resumable_dataloader', 'ResumableEpochBasedTrainLoop']
