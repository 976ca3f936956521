"""Field types the schema's section modules share (hybrid/config/schema.py): positive
integers, file lists, the FSDP strategy and mixed-precision choices, and `_ok`, which
cross-key rules use to skip values that already failed their own check."""

from __future__ import annotations

from typing import Any

from hybrid.config.typed import INVALID, Annotated, Fixed, OneOf, Positive

PositiveInt = Annotated[int, Positive()]
OptionalPositiveInt = Annotated[int | None, Positive()]
Paths = str | tuple[str, ...]

FSDP = OneOf(lambda: ("fsdp", "fsdp2"), unsupported=(("megatron", "hybrid trains with FSDP only"),))
MIXED_PRECISION = OneOf(lambda: ("auto", "bf16", "fp32"))
NO_COMPILE = Fixed((False,), "hybrid does not torch.compile its models")


def _ok(*values: Any) -> bool:
    """True when none of `values` failed its own check (cross-key rules skip those)."""
    return all(v is not INVALID for v in values)
