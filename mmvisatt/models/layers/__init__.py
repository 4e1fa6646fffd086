"""Modules two or more backbone files share (attention entry point, windows, patches, residual attention, the
spatial decay of RMT and EVT, checkpointing, memory tricks). Import them from their modules; what one architecture
alone uses lives in its backbone file."""
