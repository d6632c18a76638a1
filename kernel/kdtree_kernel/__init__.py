"""DDTree verify attention for absorbed MLA: CUDA kernel (when built) and its pure-torch reference."""

from .mask import WORD_BITS, mask_words, pack_draft_mask, unpack_draft_mask
from .reference import verify_attention_reference

__all__ = [
    "WORD_BITS",
    "mask_words",
    "pack_draft_mask",
    "unpack_draft_mask",
    "verify_attention_reference",
]
