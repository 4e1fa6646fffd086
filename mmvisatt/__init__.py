"""mmvisatt: recent vision-transformer attention backbones for OpenMMLab dense prediction.

``import mmvisatt.models`` registers the models only; configs list what else they need in ``custom_imports``
(``mmvisatt.engine`` for the hooks and checkpoint loading, ``mmvisatt.datasets.transforms`` for the pipelines).
Importing the package checks that mmcv, mmengine and the task libraries are one supported stack
(:mod:`mmvisatt.stack`), upstream OpenMMLab or the onedl fork.
"""
from .stack import check_stack
from .version import __version__

check_stack()

__all__ = ['__version__']
