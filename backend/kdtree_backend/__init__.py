"""SGLang attention backend ``kdtree``: DDTree target-verify through the kdtree_kernel, Triton for the rest.

Importing this package does not import SGLang: the replay service (``python -m kdtree_backend.replay``) runs on
hosts that only have torch, numpy and this release's ``kernel/`` and ``backend/`` packages. The SGLang parts
live in :mod:`kdtree_backend.backend` and :mod:`kdtree_backend.plugin`.
"""

BACKEND_NAME = "kdtree"
SUPPORTED_SGLANG_VERSION = "0.5.23"

__all__ = ["BACKEND_NAME", "SUPPORTED_SGLANG_VERSION"]
