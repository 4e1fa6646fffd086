from .parity import parity_model

__all__ = ['parity_model']
