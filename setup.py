import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))
# what a wheel carries besides the package, as mmdet does: mim and non-editable installs find the configs,
# tools and the measured memory table (the pre-flight reads it) in mmvisatt/.mim
MIM_ITEMS = ('configs', 'tools', 'model-index.yml', 'docs/config_memory.json')


def read_requirements(name):
    path = osp.join(osp.dirname(__file__), 'requirements', name)
    with open(path) as f:
        lines = (line.split('#')[0].strip() for line in f)
        return [line for line in lines if line]


def read_version():
    scope = {}
    with open(osp.join(osp.dirname(__file__), 'mmvisatt', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def add_mim_extension():
    """Fill ``mmvisatt/.mim`` with MIM_ITEMS: symbolic links for an editable install (edits show at once), copies
    for a wheel, so that an installed package holds its configs and tools. Returns the files to package."""
    if any(cmd in sys.argv for cmd in ('develop', 'editable_wheel')):
        mode = 'symlink'
    elif any(cmd in sys.argv for cmd in ('sdist', 'bdist_wheel', 'build', 'build_py', 'install')):
        mode = 'copy'
    else:
        return []
    mim = osp.join(ROOT, 'mmvisatt', '.mim')
    os.makedirs(mim, exist_ok=True)
    for item in MIM_ITEMS:
        src, dst = osp.join(ROOT, item), osp.join(mim, item)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        os.makedirs(osp.dirname(dst), exist_ok=True)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, osp.dirname(dst)), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)
    package = osp.join(ROOT, 'mmvisatt')
    return [osp.relpath(osp.join(folder, name), package)
            for folder, _, names in os.walk(mim, followlinks=True) for name in names]


setup(
    name='mmvisatt',
    version=read_version(),
    description='Recent vision-transformer attention backbones for OpenMMLab dense prediction',
    long_description=open(osp.join(osp.dirname(__file__), 'README.md')).read()
    if osp.exists(osp.join(osp.dirname(__file__), 'README.md')) else '',
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    packages=find_packages(exclude=('configs', 'tools', 'tests', 'docs')),
    package_data={'mmvisatt': add_mim_extension()},
    # torch 2.6, the lowest torch the code runs on (requirements/runtime.txt), needs Python 3.9
    python_requires='>=3.9',
    # no OpenMMLab distribution: mmcv, mmengine and the task libraries come from upstream (the `mim` extra) or the
    # onedl fork (the `onedl` extra), which install the same modules; `import mmvisatt` checks their versions
    install_requires=read_requirements('runtime.txt'),
    # the corruption benchmark and ONNX export are extras too
    extras_require={
        'mim': read_requirements('mminstall.txt'),
        'onedl': read_requirements('onedl.txt'),
        'robustness': read_requirements('robustness.txt'),
        'onnx': read_requirements('onnx.txt'),
        'tests': read_requirements('tests.txt') + read_requirements('robustness.txt') + read_requirements('onnx.txt'),
        'all': (read_requirements('mminstall.txt') + read_requirements('tests.txt')
                + read_requirements('robustness.txt') + read_requirements('onnx.txt')),
    },
    zip_safe=False,
)
