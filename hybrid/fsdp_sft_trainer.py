"""verl's SFT entry point spelled under hybrid: `python -m hybrid.fsdp_sft_trainer key=value ...`.

verl scripts run `python -m verl.trainer.fsdp_sft_trainer` (or torchrun -m ...); replacing
`verl.trainer` with `hybrid` is the only edit they need. Everything is hybrid/sft_trainer.py.
"""

from __future__ import annotations

from hybrid.sft_trainer import cli, main, run_sft

__all__ = ["cli", "main", "run_sft"]

if __name__ == "__main__":
    cli()
