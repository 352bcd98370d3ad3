"""Model adapters and the model catalogue (controller side).

Real adapters (TensorFlow, PyTorch) import their framework lazily inside ``build`` so that the
core, local mode and the fake model never need them.
"""
