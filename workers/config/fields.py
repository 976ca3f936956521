"""Field types the worker sections share: the FSDP strategy, mixed precision, and the
torch.compile switch hybrid accepts only off."""

from __future__ import annotations

from protocol.config_schema import Fixed, OneOf

FSDP = OneOf(lambda: ("fsdp", "fsdp2"), unsupported=(("megatron", "hybrid trains with FSDP only"),))
MIXED_PRECISION = OneOf(lambda: ("auto", "bf16", "fp32"))
NO_COMPILE = Fixed((False,), "hybrid does not torch.compile its models")
