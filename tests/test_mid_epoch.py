"""Exact mid-epoch resume (mmvisatt/engine/mid_epoch.py): the resumable batch sampler passes over consumed batches
without loading them, per-sample augmentation seeds, the layout check, the configs. The SIGKILL-and-resume runs are
in tests/test_reliability.py; docs/reliability.md says what is exact."""
import glob
import os.path as osp
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmdet.datasets.samplers import AspectRatioBatchSampler  # noqa: F401  (registers it)
from mmengine.config import Config, ConfigDict
from mmengine.dataset import DefaultSampler, pseudo_collate
from mmengine.logging import MessageHub
from torch.utils.data import DataLoader, Dataset

from conftest import CONFIGS
from mmvisatt.engine.mid_epoch import (POSITION_KEY, MidEpochResumeError, ResumableBatchSampler,
                                       ResumableEpochBasedTrainLoop, SeededSamples, resumable_dataloader,
                                       sample_seed)


class Images(Dataset):
    """Images of two aspect ratios whose loads are counted; an item draws from every random generator, as
    augmentation does."""

    def __init__(self) -> None:
        self.loads = []
        self.metainfo = dict(classes=('a', 'b'))

    def __len__(self) -> int:
        return 23

    def get_data_info(self, index: int) -> dict:
        return dict(width=40 if index % 3 else 60, height=50)

    def __getitem__(self, index: int):
        self.loads.append(index)
        return index, random.random(), float(np.random.rand()), float(torch.rand(()))


def _batches(dataset, batching, skip=0, epoch=1):
    sampler = DefaultSampler(dataset, shuffle=True, seed=3)
    sampler.set_epoch(epoch)
    batch_sampler = ResumableBatchSampler(sampler, 4, batch_sampler=batching)
    batch_sampler.start_epoch(epoch, seed=3, skip=skip)
    return batch_sampler, list(batch_sampler)


@pytest.mark.parametrize('batching', [None, dict(type='mmdet.AspectRatioBatchSampler')],
                         ids=['default', 'aspect_ratio'])
def test_a_resumed_epoch_continues_at_the_next_batch_without_loading_the_consumed_ones(batching):
    dataset = Images()
    batch_sampler, full = _batches(dataset, batching)
    assert len(full) == len(batch_sampler) == 6
    _, rest = _batches(dataset, batching, skip=4)
    assert rest == full[4:]
    # the skip applies to one pass only
    assert list(batch_sampler) == full
    if batching is not None:  # grouped by aspect ratio, so not just the shuffled order cut into fours
        assert all(len({dataset.get_data_info(i)['width'] for i, _ in b}) == 1 for b in full[:4])
    batch_sampler.start_epoch(1, seed=3, skip=4)
    loader = DataLoader(SeededSamples(dataset), batch_sampler=batch_sampler, collate_fn=pseudo_collate)
    resumed = list(loader)
    assert dataset.loads == [i for batch in full[4:] for i, _ in batch]
    dataset.loads.clear()
    batch_sampler.start_epoch(1, seed=3)
    uninterrupted = list(loader)
    assert resumed == uninterrupted[4:]  # augmentation included


def test_augmentation_draws_from_a_seed_per_sample_and_epoch():
    dataset = SeededSamples(Images())
    state = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    first = dataset[(5, sample_seed(0, 1, 5))]
    assert dataset[(5, sample_seed(0, 1, 5))] == first
    assert dataset[(5, sample_seed(0, 2, 5))][1:] != first[1:]  # another epoch
    assert dataset[(6, sample_seed(0, 1, 6))][1:] != first[1:]
    assert dataset[(5, sample_seed(1, 1, 5))][1:] != first[1:]  # another config seed
    # the caller's generators are where they were
    assert random.getstate() == state[0] and (np.random.get_state()[1] == state[1]).all()
    assert torch.equal(torch.get_rng_state(), state[2])
    # plain indices pass through; the wrapped dataset's attributes read through
    assert dataset[5][0] == 5 and len(dataset) == 23 and dataset.metainfo['classes'] == ('a', 'b')
    assert dataset.get_data_info(3)['width'] == 60


def test_dataloader_config_is_wrapped_and_the_original_left_alone():
    coco = dict(type='CocoDataset', ann_file='a.json')
    cfg = dict(batch_size=2, drop_last=True, dataset=coco,
               batch_sampler=dict(type='AspectRatioBatchSampler'), sampler=dict(type='DefaultSampler'))
    wrapped = resumable_dataloader(ConfigDict(cfg))
    assert wrapped['dataset'] == dict(type='SeededSamples', dataset=coco)
    assert wrapped['batch_sampler'] == dict(type='ResumableBatchSampler', drop_last=True,
                                            batch_sampler=dict(type='AspectRatioBatchSampler'))
    assert 'drop_last' not in wrapped and cfg['drop_last'] is True and cfg['dataset'] is coco
    assert resumable_dataloader(cfg) == wrapped


def _loop(epoch: int, iteration: int, position: dict, batch_size: int = 4):
    """A ResumableEpochBasedTrainLoop as a resumed Runner leaves it (only what resumed_batches reads)."""
    loop = ResumableEpochBasedTrainLoop.__new__(ResumableEpochBasedTrainLoop)
    hub = MessageHub(f'mid_epoch_{id(loop)}')
    if position is not None:
        hub.update_info(POSITION_KEY, position)
    loop._runner = SimpleNamespace(message_hub=hub)
    loop._epoch, loop._iter = epoch, iteration
    sampler = ResumableBatchSampler(DefaultSampler(Images(), shuffle=False), batch_size)
    loop.dataloader = DataLoader(Images(), batch_sampler=sampler)
    return loop


def test_mid_epoch_position_and_layout_check():
    position = dict(epoch=1, start_iter=6, world_size=1, batch_size=4, batches=6)
    assert _loop(1, 9, position).resumed_batches() == 3
    assert _loop(2, 12, position).resumed_batches() == 0  # an epoch-end checkpoint
    assert _loop(1, 6, position).resumed_batches() == 0
    assert _loop(0, 0, None).resumed_batches() == 0  # a fresh run
    with pytest.raises(MidEpochResumeError) as error:
        _loop(1, 9, position, batch_size=2).resumed_batches()
    message = str(error.value)
    assert 'inside epoch 2, after 3 of its 6 batches, by 1 process(es) with 4 images each' in message
    assert 'this run has 1 x 2' in message and 'epoch_1.pth' in message
    with pytest.raises(MidEpochResumeError, match='by 2 process'):
        _loop(1, 9, dict(position, world_size=2)).resumed_batches()
    with pytest.raises(MidEpochResumeError, match=r'or start afresh \(no epoch had finished\)'):
        _loop(0, 3, dict(position, epoch=0, start_iter=0, batches=7)).resumed_batches()


def test_every_epoch_based_config_checkpoints_and_resumes_inside_epochs():
    epoch_based = 0
    for path in sorted(glob.glob(osp.join(CONFIGS, '*.py'))):
        cfg = Config.fromfile(path)
        if 'max_epochs' not in cfg.train_cfg:
            continue
        epoch_based += 1
        name = osp.basename(path)
        assert cfg.train_cfg.type == 'ResumableEpochBasedTrainLoop', name
        checkpoint = cfg.default_hooks.checkpoint
        assert checkpoint.type == 'AtomicCheckpointHook' and checkpoint.interval == 1, name
        # COCO: 7,330 iterations an epoch at 16 images; ImageNet: about 1,250 at 1,024
        expected = 500 if cfg.default_scope == 'mmpretrain' else 2000
        assert (checkpoint.mid_epoch_interval, checkpoint.mid_epoch_max_keep) == (expected, 2), name
    assert epoch_based > 100
