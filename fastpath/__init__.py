"""fastpath: validate a model's GPU fast path and ship the evidence as a signed bundle.

Submodules are imported on demand (``fastpath.trace`` must stay dependency-free for model code).
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("fastpath")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
