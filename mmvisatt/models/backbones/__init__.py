from .revit import ReMViTv2, ReSwinTransformer, ReViT

__all__ = ['ReMViTv2', 'ReSwinTransformer', 'ReViT']
