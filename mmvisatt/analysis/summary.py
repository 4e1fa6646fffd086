"""Model summary: parameters per stage and the residual gates (``alpha``) with their learned values.

A gate is any attribute named ``alpha``: a parameter (learnable unless frozen), a buffer, or a plain number
(the official ReSwin mode mixes with the constant 0.5 and has no parameter to learn or load).
"""
from dataclasses import dataclass
from numbers import Number
from typing import Dict, List, Tuple

import torch.nn as nn

GATE_NAME = 'alpha'


@dataclass
class Gate:
    """``kind`` is 'parameter', 'frozen parameter', 'buffer' or 'constant'; ``learnable`` whether training
    updates it."""
    name: str
    value: List[float]
    kind: str
    learnable: bool

    def describe(self) -> str:
        value = ', '.join(f'{v:.6g}' for v in self.value)
        return f'{self.name} = {value} ({self.kind}{", learnable" if self.learnable else ""})'


def residual_gates(model: nn.Module) -> List[Gate]:
    """Every residual gate of ``model``, in module order."""
    gates = []
    for prefix, module in model.named_modules():
        name = f'{prefix}.{GATE_NAME}' if prefix else GATE_NAME
        if GATE_NAME in module._parameters and module._parameters[GATE_NAME] is not None:
            p = module._parameters[GATE_NAME]
            gates.append(Gate(name, p.detach().flatten().tolist(),
                              'parameter' if p.requires_grad else 'frozen parameter', p.requires_grad))
        elif GATE_NAME in module._buffers and module._buffers[GATE_NAME] is not None:
            gates.append(Gate(name, module._buffers[GATE_NAME].flatten().tolist(), 'buffer', False))
        else:
            value = module.__dict__.get(GATE_NAME)
            if isinstance(value, Number) and not isinstance(value, bool):
                gates.append(Gate(name, [float(value)], 'constant', False))
    return gates


def _groups(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """Top-level children, with module lists (stages, blocks) split into their elements."""
    groups = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            groups.extend((f'{name}.{sub}', module) for sub, module in child.named_children())
        else:
            groups.append((name, child))
    return groups


def _count(params) -> Tuple[int, int]:
    params = list(params)
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


@dataclass
class ParameterRow:
    name: str
    params: int
    trainable: int


def parameter_table(model: nn.Module) -> List[ParameterRow]:
    """Parameters per stage (top-level module or list element) and per top-level parameter; rows sum to the total.

    Parameters shared between groups are counted once, in the first group that holds them.
    """
    rows, seen = [], set()
    for name, param in model.named_parameters(recurse=False):
        seen.add(id(param))
        rows.append(ParameterRow(name, param.numel(), param.numel() if param.requires_grad else 0))
    for name, module in _groups(model):
        params = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            rows.append(ParameterRow(name, *_count(params)))
    return rows


def model_summary(model: nn.Module) -> Dict:
    """Parameter table, totals and residual gates of ``model`` as plain data (for JSON)."""
    rows = parameter_table(model)
    total, trainable = _count(model.parameters())
    return dict(model=type(model).__name__, total_params=total, trainable_params=trainable,
                stages=[dict(name=r.name, params=r.params, trainable=r.trainable) for r in rows],
                gates=[dict(name=g.name, value=g.value, kind=g.kind, learnable=g.learnable)
                       for g in residual_gates(model)])


def format_summary(model: nn.Module) -> str:
    """A readable summary: parameters per stage (M = 1e6), the total, and every residual gate."""
    rows = parameter_table(model)
    total, trainable = _count(model.parameters())
    width = max([len(r.name) for r in rows] + [len('total')])
    lines = [f'{type(model).__name__}', f'{"stage":<{width}}  {"params":>12}  {"share":>6}']
    for row in rows:
        frozen = '' if row.trainable == row.params else f'  ({row.params - row.trainable:,} frozen)'
        share = 100.0 * row.params / total if total else 0.0
        lines.append(f'{row.name:<{width}}  {row.params:>12,}  {share:>5.1f}%{frozen}')
    lines.append(f'{"total":<{width}}  {total:>12,}  ({total / 1e6:.2f}M, {trainable:,} trainable)')
    gates = residual_gates(model)
    lines.append('residual gates:' if gates else 'residual gates: none')
    lines.extend(f'  {g.describe()}' for g in gates)
    return '\n'.join(lines)
