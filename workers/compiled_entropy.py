"""verl's `actor.use_torch_compile` / `ref.use_torch_compile`: the entropy of the logits runs
through `torch.compile(..., dynamic=True)`, as verl's dp_actor compiles its
`entropy_from_logits` (verl compiles nothing else on this path: the model and the log-probs stay
eager). The chunk loop of workers/loss_math.entropy_from_logits stays in Python and each chunk
goes through the compiled function, so a long batch never materialises its whole softmax.

On a CPU the inductor builds C++ kernels with the machine's compiler (g++); the first call of a
process pays the compile (seconds), later shapes reuse it (dynamic shapes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from workers.loss_math import chunk_entropy, entropy_from_logits


@functools.cache
def _compiled_chunk_entropy() -> Callable[[torch.Tensor], torch.Tensor]:
    # One compiled function per process (verl builds one per actor; the graph is the same).
    return torch.compile(chunk_entropy, dynamic=True)


def entropy_function(use_torch_compile: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """`entropy_from_logits`, its chunks computed by the compiled function when `use_torch_compile`."""
    if not use_torch_compile:
        return entropy_from_logits
    return functools.partial(entropy_from_logits, chunk_fn=_compiled_chunk_entropy())
