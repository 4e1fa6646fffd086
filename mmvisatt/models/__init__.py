"""Importing this package registers every mmvisatt model in mmengine's root registries."""
from .backbones import *  # noqa: F401,F403
