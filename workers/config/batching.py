"""How a section sizes one forward pass: `MicroBatching` (a sample count, or a token
budget with `use_dynamic_bsz`), and the log-prob keys the rollout and reference sections
share. workers/micro_batch.py turns it into index lists."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.ulysses import SequenceParallel


@dataclass(frozen=True)
class MicroBatching:
    """One forward pass's share of a rank's batch, read from a config section.

    `micro_batch_size` (samples per device) applies unless `use_dynamic_bsz`; then
    micro-batches are packed up to `max_token_len` real tokens instead. With `share_prompts`
    the rows of a prompt group stay together and are packed prompt-once
    (workers/shared_prefix.py): a group counts its prompt once against the token budget.
    """

    micro_batch_size: int | None
    use_dynamic_bsz: bool
    max_token_len: int
    share_prompts: bool = False

    def for_model(self, share_prompts: bool, sp: SequenceParallel | None) -> MicroBatching:
        """As a model's passes run it: prompt-once or not, and a token budget that is per
        device of a sequence-parallel group `sp`, so the group's rows get sp.size times as
        many (verl's rule)."""
        return replace(self, share_prompts=share_prompts, max_token_len=self.max_token_len * (sp.size if sp else 1))


class LogProbBatching:
    """The reading of verl's log-prob pass keys, which the rollout and reference sections
    both have (`log_prob_micro_batch_size_per_gpu`, `log_prob_use_dynamic_bsz`,
    `log_prob_max_token_len_per_gpu`)."""

    @property
    def log_prob_batching(self) -> MicroBatching:
        """The log-prob pass's micro-batches (samples per device, or a token budget)."""
        return MicroBatching(
            self.log_prob_micro_batch_size_per_gpu, self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu
        )


def mini_batch_samples_per_rank(ppo_mini_batch_size: int, rollout_n: int, data_parallel_size: int) -> int:
    """Rows of one optimizer step on one rank: `ppo_mini_batch_size` counts prompts (verl's
    unit), each with its `rollout.n` responses, split evenly over the data-parallel groups;
    rounded up, for the dummy rows that trainer.pad_mini_batches adds to a mini-batch that does
    not split (without that option the rules refuse such sizes)."""
    return max(-(-ppo_mini_batch_size * rollout_n // data_parallel_size), 1)


def shares_prompts(use_prefix_grouper: bool | None, rollout_n: int, use_remove_padding: bool) -> bool:
    """`actor.use_prefix_grouper`: null (the default) means on wherever rows are packed
    (`use_remove_padding`) and a prompt has more than one sample, so sharing saves work;
    true packs prompt-once whatever use_remove_padding says (verl's prefix grouper pads
    nothing either); false never."""
    if use_prefix_grouper is None:
        return rollout_n > 1 and use_remove_padding
    return bool(use_prefix_grouper)
