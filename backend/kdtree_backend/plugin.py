"""SGLang plugin entry point (``sglang.srt.plugins``: ``kdtree = kdtree_backend.plugin:register``).

``register()`` makes ``kdtree`` a valid ``--attention-backend`` / ``--prefill-attention-backend`` choice and
registers the factory with SGLang's attention registry. The backend module (which imports SGLang's Triton
backend) loads only when a server actually builds the ``kdtree`` backend.
"""

from __future__ import annotations

from typing import Any

from . import BACKEND_NAME


def create_kdtree_backend(runner: Any) -> Any:
    """Factory SGLang calls with its ModelRunner (same preconditions as upstream's triton factory)."""
    if runner.model_config.is_encoder_decoder:
        raise ValueError("the kdtree attention backend does not support cross attention; use flashinfer")
    from .backend import KdtreeAttnBackend

    return KdtreeAttnBackend(runner)


def register() -> None:
    """Idempotent: safe when SGLang loads plugins in several processes or more than once."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_kdtree_backend:
        register_attention_backend(BACKEND_NAME)(create_kdtree_backend)
