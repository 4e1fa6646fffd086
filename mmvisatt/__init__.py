"""mmvisatt: recent vision-transformer attention backbones for OpenMMLab dense prediction.

``import mmvisatt.models`` registers the models only; configs list what else they need in ``custom_imports``
(``mmvisatt.engine`` for the hooks and checkpoint loading, ``mmvisatt.datasets.transforms`` for the pipelines).
"""
from .version import __version__

__all__ = ['__version__']
