from . import engine  # noqa: F401  (lets torch >= 2.6 load mmengine checkpoints; registers hooks)
from .datasets import transforms  # noqa: F401  (registers CheckImageIntegrity, in every config's pipelines)
from .version import __version__

__all__ = ['__version__']
