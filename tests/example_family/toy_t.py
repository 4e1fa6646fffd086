# Toy-T: ToyPyramid's only preset (16-32-64-128 channels, depths 1-1-2-1). What every task config of this backbone
# shares; a task config inherits a model/dataset/schedule/runtime _base_ and this file (docs/contributing.md).
preset = dict(
    name='Toy-T',
    backbone=dict(type='ToyPyramid', arch='t'),
    channels=[16, 32, 64, 128],
    # parameters (by name substring) trained without weight decay
    no_decay=['norm'])
