import os.path as osp

from setuptools import find_packages, setup


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


setup(
    name='mmvisatt',
    version=read_version(),
    description='Recent vision-transformer attention backbones for OpenMMLab dense prediction',
    long_description=open(osp.join(osp.dirname(__file__), 'README.md')).read()
    if osp.exists(osp.join(osp.dirname(__file__), 'README.md')) else '',
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    packages=find_packages(exclude=('configs', 'tools', 'tests', 'docs')),
    python_requires='>=3.8',
    install_requires=read_requirements('runtime.txt'),
    extras_require={
        'mim': read_requirements('mminstall.txt'),
        'tests': read_requirements('tests.txt'),
        'all': read_requirements('mminstall.txt') + read_requirements('tests.txt'),
    },
    zip_safe=False,
)
