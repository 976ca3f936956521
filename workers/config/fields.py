"""Field types the worker sections share: the FSDP strategy and mixed precision."""

from __future__ import annotations

from protocol.config_schema import OneOf

FSDP = OneOf(lambda: ("fsdp", "fsdp2"), unsupported=(("megatron", "hybrid trains with FSDP only"),))
MIXED_PRECISION = OneOf(lambda: ("auto", "bf16", "fp32"))
