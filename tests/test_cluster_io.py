"""What a cluster's storage and other libraries in the process see of this package: each image read once per epoch
through any file backend, and imports that change nothing global beyond the registries."""
import os.path as osp
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from mmengine.config import Config
from mmengine.fileio import LocalBackend, register_backend

from conftest import CONFIGS, REPO


class CountingBackend(LocalBackend):
    """A local backend that counts what is fetched, standing for remote storage (petrel, S3, HTTP)."""
    reads: Counter = Counter()

    def get(self, filepath):
        CountingBackend.reads[str(filepath)] += 1
        return super().get(filepath)


register_backend('mmvisatt_counting', CountingBackend, force=True)
BACKEND = dict(backend='mmvisatt_counting')


@pytest.mark.parametrize('config', ['mask_rcnn_reswin_t_3x.py', 'upernet_reswin_t_160k_ade20k.py'])
def test_each_image_is_read_once_per_epoch_through_a_file_backend(config):
    """The configs' own training pipelines (the integrity check included), over the demo images, with
    ``backend_args`` naming a counting backend: one fetch per image per epoch."""
    from mmengine.registry import DATASETS, init_default_scope

    import mmvisatt.datasets.transforms  # noqa: F401  (the checked loader)
    from mmvisatt.engine import to_demo_config

    cfg = Config.fromfile(osp.join(CONFIGS, config))
    init_default_scope(cfg.default_scope)
    pipeline = [dict(step) for step in cfg.train_dataloader.dataset.pipeline]
    assert pipeline[0]['type'] == 'LoadCheckedImageFromFile'
    pipeline[0]['backend_args'] = BACKEND
    demo = to_demo_config(Config.fromfile(osp.join(CONFIGS, config)))
    dataset = DATASETS.build(dict(demo.train_dataloader.dataset, pipeline=pipeline))
    indices = range(min(len(dataset), 12))
    for epoch in range(2):
        CountingBackend.reads.clear()
        for i in indices:
            assert dataset[i]['inputs'].shape[0] == 3
        paths = {dataset.get_data_info(i)['img_path'] for i in indices}
        assert set(CountingBackend.reads) == paths
        assert set(CountingBackend.reads.values()) == {1}, CountingBackend.reads


def test_a_truncated_image_is_refused_from_a_file_backend(tmp_path):
    from mmvisatt.datasets.transforms import CorruptImageError, LoadCheckedImageFromFile
    import cv2
    import numpy as np
    ok, encoded = cv2.imencode('.jpg', np.full((30, 40, 3), 127, np.uint8))
    path = tmp_path / 'cut.jpg'
    path.write_bytes(encoded.tobytes()[:-200])
    CountingBackend.reads.clear()
    with pytest.raises(CorruptImageError, match=rf'{path} is truncated'):
        LoadCheckedImageFromFile(backend_args=BACKEND)(dict(img_path=str(path)))
    assert CountingBackend.reads[str(path)] == 1


def _run(code: str) -> str:
    run = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_importing_the_models_changes_nothing_global():
    """``import mmvisatt.models`` registers models: torch's safe globals and mmengine's checkpoint loaders stay as
    they were, also after this package has read a checkpoint with its stand-ins; ``import mmvisatt.engine`` (the
    configs' ``custom_imports``) is what makes the safe loader mmengine's."""
    out = _run('''
        import argparse, os, tempfile
        import torch
        import torch._dynamo  # torch allowlists its own _DimRange when Dynamo is first imported
        from mmengine.runner.checkpoint import CheckpointLoader
        torch.serialization.add_safe_globals([argparse.ArgumentParser])  # another library's own entry
        before = (set(torch.serialization.get_safe_globals()), dict(CheckpointLoader._schemes))
        import mmvisatt.models, mmvisatt.checkpoint
        assert (set(torch.serialization.get_safe_globals()), dict(CheckpointLoader._schemes)) == before
        path = os.path.join(tempfile.mkdtemp(), 'release.pth')
        torch.save({'model': {'w': torch.ones(1)}, 'args': argparse.Namespace(lr=1)}, path)
        loaded = mmvisatt.checkpoint.load_checkpoint_file(path)  # needs the stand-in for argparse.Namespace
        assert loaded['args'].lr == 1
        assert (set(torch.serialization.get_safe_globals()), dict(CheckpointLoader._schemes)) == before
        try:
            torch.load(path, weights_only=True)
        except Exception as error:
            print('torch alone refuses:', 'argparse.Namespace' in str(error))
        import mmvisatt.engine
        from mmvisatt.checkpoint.safe_load import _mmengine_local_loader, _mmengine_url_loader
        schemes = CheckpointLoader._schemes
        print('engine:', schemes[''] is _mmengine_local_loader, schemes['https://'] is _mmengine_url_loader)
        print('safe globals kept:', set(torch.serialization.get_safe_globals()) == before[0])
    ''')
    assert 'torch alone refuses: True' in out
    assert 'engine: True True' in out and 'safe globals kept: True' in out


def test_the_readme_says_what_importing_the_models_does():
    with open(osp.join(REPO, 'README.md')) as f:
        readme = ' '.join(f.read().split())
    assert '`import mmvisatt.models` registers the backbones and changes nothing else' in readme
