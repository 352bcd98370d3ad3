"""Device-side code: stdlib only, shipped per run as a zipapp, never resident.

Nothing in this package may import anything outside the Python standard library at module
level (real model adapters import their framework lazily, inside their ``build`` function).
"""
