from .revit import ReSwinTransformer

__all__ = ['ReSwinTransformer']
