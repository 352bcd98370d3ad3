"""llama.cpp's RPC backend as a dit runtime (issue 17).

``build`` builds the binaries from the mirrored llama-cpp-python sdist, ``launch`` holds the pure argv
builders and the interface guard for ``rpc-server``, ``results`` parses a run's output into the same
columns as HeadSplit's summary, and ``dit_runtime`` implements dit's runtime interface.
"""

__version__ = "0.1.0"
