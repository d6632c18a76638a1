"""DDTree verify attention for absorbed MLA: CUDA kernel (when built) and its pure-torch reference."""

from .extension import ExtensionNotBuilt, extension_available, load_extension
from .mask import WORD_BITS, ancestor_mask, mask_words, pack_draft_mask, unpack_draft_mask
from .ops import launch_plan, verify_attention, workspace_size
from .plan import LaunchPlan, plan_launch
from .reference import verify_attention_reference

__all__ = [
    "WORD_BITS",
    "ExtensionNotBuilt",
    "LaunchPlan",
    "ancestor_mask",
    "extension_available",
    "launch_plan",
    "load_extension",
    "mask_words",
    "pack_draft_mask",
    "plan_launch",
    "unpack_draft_mask",
    "verify_attention",
    "verify_attention_reference",
    "workspace_size",
]
