"""Shared pytest set-up: the ``slow``, ``cuda`` and ``demo`` markers and a shrunk copy of the detection recipe for fast
training tests."""
import os
import os.path as osp
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = osp.join(REPO, 'configs')
# the development tools beside the package (benchmark, decay_kernels) import each other by file name, as when run
# from tools/analysis; appended, so nothing installed is shadowed
sys.path.append(osp.join(REPO, 'tools', 'analysis'))


def _share_the_cores() -> None:
    """Under pytest-xdist each worker (and what it starts) gets its share of the cores. torch otherwise gives every
    worker a thread per core, and on 2 cores two workers' OpenMP threads wait on each other at every parallel region:
    tests/test_configs.py took 5 minutes with -n 2 that way, 1.4 minutes with one thread per worker. Runs here before
    torch is imported; an OMP_NUM_THREADS set by the user wins."""
    workers = os.environ.get('PYTEST_XDIST_WORKER_COUNT')
    if workers and 'OMP_NUM_THREADS' not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
        os.environ['OMP_NUM_THREADS'] = str(max(1, cores // int(workers)))


_share_the_cores()


def _row_count_independent_gemm() -> None:
    """The chunked score strategies' forward values are bit-identical to the reference only where a matrix
    product's rows do not depend on how many rows it has. MKL's AVX2 / AVX-512 (FMA) kernels give the rows of a
    small chunk other last bits than the same rows of the whole product (tests/test_score_memory.py's many-chunk
    cases, 1 ulp in float64); its AVX kernels do not. Pinned before torch is imported; an MKL_CBWR set by the user
    wins. Costs nothing measurable here (the suite's GEMMs are small; convolutions are oneDNN's)."""
    os.environ.setdefault('MKL_CBWR', 'AVX')


_row_count_independent_gemm()


def _write_yapf_grammar_cache() -> None:
    """mmengine imports yapf, which keeps its grammar as pickles in the user's cache directory and writes them again
    whenever the installed grammar files are newer (in every new virtual environment). Two pytest-xdist workers
    importing mmengine at once can then read a pickle the other is writing (EOFError at collection). Imported once
    here, in the controlling process before any worker starts, yapf writes them first."""
    try:
        import yapf  # noqa: F401
    except ImportError:
        pass


def pytest_configure(config):
    if not os.environ.get('PYTEST_XDIST_WORKER'):
        _write_yapf_grammar_cache()
    config.addinivalue_line('markers', 'slow: takes minutes (end-to-end training, several processes); '
                            'still part of the suite, deselect with -m "not slow" for a quick pass')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU; skipped with the reason where none is visible '
                            '(pytest tests/test_cuda.py -m cuda on a GPU machine, or tools/gpu_check.sh)')
    config.addinivalue_line('markers', 'demo: the whole README demo against its numbers (10-17 minutes); skipped '
                            'unless asked for: pytest -m demo tests/test_demo_train.py')


def pytest_collection_modifyitems(config, items):
    # Slow tests first (stable, so files keep their order otherwise): under pytest-xdist a test of several minutes
    # started last keeps one worker busy while the other has nothing left to do.
    items.sort(key=lambda item: item.get_closest_marker('slow') is None)
    # The suite's budget is 20 minutes on 2 cores, and the whole demo alone takes 10-17 of them.
    if 'demo' not in (config.getoption('markexpr') or ''):
        demo = pytest.mark.skip(reason='the whole README demo (10-17 min): pytest -m demo tests/test_demo_train.py')
        for item in items:
            if item.get_closest_marker('demo') is not None:
                item.add_marker(demo)
    import torch
    if not torch.cuda.is_available():
        reason = (f'needs a CUDA GPU; torch {torch.__version__} sees none (built with CUDA {torch.version.cuda}, '
                  f'{torch.cuda.device_count()} devices)')
        for item in items:
            if item.get_closest_marker('cuda') is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(params=['one_chunk', 'many_chunks'])
def chunking(request):
    """Runs a test with the chunked score strategies' default row chunks and with the smallest ones (one query-grid
    row, or one pooling window of rows, per chunk)."""
    from mmvisatt.models.layers import score_memory
    default = score_memory.score_chunk_numel()
    if request.param == 'many_chunks':
        score_memory.set_score_chunk_numel(1)
    yield request.param
    score_memory.set_score_chunk_numel(default)


@pytest.fixture(scope='session')
def tiny_det_config(tmp_path_factory) -> str:
    """``mask_rcnn_reswin_t_3x.py`` with a one-block-per-stage, 16-channel ReSwin: same types and recipe,
    a fraction of the compute. Use it with ``--demo``."""
    path = tmp_path_factory.mktemp('configs') / 'mask_rcnn_reswin_tiny.py'
    path.write_text(
        f"_base_ = [{osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py')!r}]\n"
        "model = dict(\n"
        "    backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))),\n"
        "    neck=dict(in_channels=[16, 32, 64, 128]))\n")
    return str(path)


@pytest.fixture
def python() -> str:
    """The interpreter running the tests, for subprocesses."""
    return sys.executable


@pytest.fixture(scope='session')
def demo_det_run(tiny_det_config, tmp_path_factory) -> str:
    """Work dir of a 3-iteration ``tools/train.py tiny_det_config --demo`` run: ``iter_3.pth`` and logs of every
    iteration and of two validations (iterations 0 and 3, on 2 of the demo's validation images)."""
    from mmvisatt.engine import train_main
    work_dir = str(tmp_path_factory.mktemp('demo_det_run'))
    # a visualizer of its own: the configs name theirs 'visualizer', and a Runner reuses an instance of that name
    # made by an earlier run in this process, logging to that run's folder instead of this one's
    train_main([tiny_det_config, '--demo', '--work-dir', work_dir, '--cfg-options', 'train_cfg.max_iters=3',
                'default_hooks.logger.interval=1', 'val_dataloader.dataset.indices=2',
                'visualizer.name=demo_det_run'])
    return work_dir
