"""Multi-domain training batches, as ROLL's RLVR pipeline draws them (`data.domain_quotas`).

ROLL (roll/pipeline/rlvr/rlvr_pipeline.py) gives each row a domain: its own `domain` column when
set, else the domain whose `rewards.<domain>.tag_included` lists the row's `tag`, else
`math_rule`. ROLL's VLM pipeline (rlvr_vlm_pipeline.py, the one a vision-language policy
trains with) keeps neither column from the file: its dataset's tag is the row's `data_source`
(roll/datasets/vlm_dataset_utils.py), and the domain follows from that tag alone; so here for a
vision-language policy (`assign_domains(..., vision=True)`). Every batch of
`rollout_batch_size` prompts is then made of fixed quotas, one per domain in the order
`domain_interleave_probs` lists them: `int(probability * batch)` prompts for each domain but
the last, and the rest for the last (its probability is not read). Each
domain draws from its own rows as an endless stream (roll/distributed/scheduler/
generate_scheduler.py, `get_next_dataset_item`): a domain's epoch is one pass over its rows,
shuffled in place by `random.seed(seed + epoch); random.shuffle(indices)` (so each epoch
shuffles the previous epoch's order), and a batch runs on into the next epoch of a domain
whose rows ran out. Here the same: `domain_quotas` computes the quotas, `assign_domains` the
rows' domains, and `DomainQuotaSampler` the order, with ROLL's shuffle (Python's `random`
seeded the same way), so the prompts of each batch are the ones ROLL's schedulers would take.

The sampler fits hybrid's resumable loader (hybrid/data_loader.py StatefulDataLoader): a loader epoch
is as many whole batches as the quota domains' rows fill, and any loader epoch's order is
recomputed from the seed, so a checkpoint holds only (epoch, batches consumed).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

DOMAIN_COLUMN = "domain"  # ROLL's column names
TAG_COLUMN = "tag"
VISION_TAG_COLUMN = "data_source"  # ROLL's VLM pipeline: a row's tag is its data_source


class DomainError(ValueError):
    """Multi-domain settings or data that cannot be used; the message names the key to change."""


def domain_quotas(probabilities: Mapping[str, float], batch_size: int) -> dict[str, int]:
    """Prompts per batch for each domain, by ROLL's rule: `int(p * batch_size)` for every domain
    but the last, which takes the rest of the batch."""
    names = list(probabilities)
    if len(names) < 2:
        raise DomainError(f"data.domain_quotas lists {len(names)} domain(s); give two or more, or leave it empty")
    quotas: dict[str, int] = {}
    for name in names[:-1]:
        p = float(probabilities[name])
        if not 0.0 <= p <= 1.0:
            raise DomainError(f"data.domain_quotas.{name}={p}: a probability between 0 and 1")
        quotas[name] = int(p * batch_size)
    rest = batch_size - sum(quotas.values())
    if rest < 0:
        raise DomainError(
            f"data.domain_quotas: the domains before {names[-1]!r} take {sum(quotas.values())} prompts, more than a "
            f"batch of {batch_size} (data.train_batch_size); lower their probabilities"
        )
    quotas[names[-1]] = rest
    return quotas


def tag_domains(domain_tags: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """tag -> domain from {domain: [tags]}; a tag listed by two domains is an error."""
    owner: dict[str, str] = {}
    for domain, tags in domain_tags.items():
        for tag in [tags] if isinstance(tags, str) else tags:
            if tag in owner and owner[tag] != domain:
                raise DomainError(
                    f"data.domain_tags: tag {tag!r} is listed by both {owner[tag]!r} and {domain!r}; give it to one"
                )
            owner[tag] = domain
    return owner


def assign_domains(
    rows: list[dict],
    domain_tags: Mapping[str, Sequence[str]],
    default_domain: str | None,
    what: str = "data",
    vision: bool = False,
) -> list[str]:
    """Each row's domain, written into its `domain` column too (the reward managers route by it):
    the row's own `domain` when set, else the domain whose tags include its `tag`, else
    `default_domain` (ROLL: math_rule). `vision` (ROLL's VLM pipeline): the tag is the row's
    `data_source` and a `domain` column of the file is not read."""
    owner = tag_domains(domain_tags)
    tag_column = VISION_TAG_COLUMN if vision else TAG_COLUMN
    label = "data_source (its tag in ROLL's VLM pipeline)" if vision else "tag"
    domains = []
    for i, row in enumerate(rows):
        domain = None if vision else row.get(DOMAIN_COLUMN)
        if domain is None:
            domain = owner.get(row.get(tag_column), default_domain)
            if domain is None:
                raise DomainError(
                    f"{what} row {i}: no 'domain' column and its {label} {row.get(tag_column)!r} is in no "
                    f"data.domain_tags list; add the {label} to a domain or set data.default_domain"
                )
            row[DOMAIN_COLUMN] = domain
        domains.append(str(domain))
    return domains


class DomainQuotaSampler:
    """Training indices laid out batch by batch: each batch holds `quotas[d]` rows of domain `d`,
    the domains in order. Same interface as hybrid/data_loader.py RLSampler (`indices_for_epoch`,
    `set_epoch`, `seed`, `shuffle`); `len` is the rows of the quota domains, so a loader epoch
    is `len // batch_size` batches."""

    def __init__(self, row_domains: Sequence[str], quotas: Mapping[str, int], shuffle: bool = True, seed: int = 1):
        self.quotas = dict(quotas)
        self.batch_size = sum(self.quotas.values())
        self.members: dict[str, list[int]] = {d: [] for d in self.quotas}
        for index, domain in enumerate(row_domains):
            if domain in self.members:
                self.members[domain].append(index)
        counts = Counter(row_domains)
        for domain, quota in self.quotas.items():
            rows = len(self.members[domain])
            if rows == 0:
                raise DomainError(
                    f"data.domain_quotas.{domain}: no training row has this domain (rows per domain: "
                    f"{dict(sorted(counts.items())) or 'none'}); check data.domain_tags and the files' tag column"
                )
            if quota > rows:
                raise DomainError(
                    f"data.domain_quotas.{domain}: {quota} prompts per batch but the domain has {rows} rows; lower "
                    f"its probability or data.train_batch_size, or add rows"
                )
        self.data_len = sum(len(m) for m in self.members.values())
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self._orders: dict[str, tuple[int, list[int]]] = {}  # domain -> (its epoch, its order then)
        self._epoch_cache: tuple[tuple[int, int, bool], list[int]] | None = None

    def __len__(self) -> int:
        return self.data_len

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        return iter(self.indices_for_epoch(self.epoch))

    def domain_order(self, domain: str, domain_epoch: int) -> list[int]:
        """Positions into the domain's rows in its epoch `domain_epoch`, ROLL's way: the list is
        shuffled in place once per epoch with Python's random seeded by seed + epoch."""
        rows = len(self.members[domain])
        if not self.shuffle:
            return list(range(rows))
        done, order = self._orders.get(domain, (-1, []))
        if domain_epoch < done:  # an earlier epoch (a resumed run): shuffle again from the start
            done, order = -1, []
        if done < 0:
            order = list(range(rows))
        else:
            order = list(order)
        for e in range(done + 1, domain_epoch + 1):
            random.Random(self.seed + e).shuffle(order)
        self._orders[domain] = (domain_epoch, order)
        return order

    def indices_for_epoch(self, epoch: int) -> list[int]:
        """The dataset indices of loader epoch `epoch`: its batches one after another."""
        key = (int(epoch), self.seed, self.shuffle)
        if self._epoch_cache is not None and self._epoch_cache[0] == key:
            return list(self._epoch_cache[1])
        batches = self.data_len // self.batch_size
        per_domain: dict[str, list[int]] = {}
        for domain, quota in self.quotas.items():
            rows = self.members[domain]
            first, count = epoch * batches * quota, batches * quota
            taken: list[int] = []
            position = first
            while len(taken) < count:
                domain_epoch, offset = divmod(position, len(rows))
                order = self.domain_order(domain, domain_epoch)
                step = min(count - len(taken), len(rows) - offset)
                taken.extend(rows[i] for i in order[offset : offset + step])
                position += step
            per_domain[domain] = taken
        indices: list[int] = []
        for b in range(batches):
            for domain, quota in self.quotas.items():
                indices.extend(per_domain[domain][b * quota : (b + 1) * quota])
        self._epoch_cache = (key, indices)
        return list(indices)


def check_domain_settings(data, problems, judged: Sequence[str] = ()) -> None:
    """The rules across the data.domain_* keys; `judged`: the domains a judge scores instead of
    a rule scorer (reward_model.judge.domains), which need no data.domain_scorers entry."""
    quotas, scorers = dict(data.domain_quotas), dict(data.domain_scorers)
    if not quotas:
        for key in ("domain_tags", "domain_scorers", "domain_scorer_kwargs"):
            if getattr(data, key):
                problems.add(f"data.{key} is set but data.domain_quotas is empty: they are read only with quotas")
        if data.default_domain is not None:
            problems.add("data.default_domain is set but data.domain_quotas is empty: it is read only with quotas")
        return
    try:
        domain_quotas(quotas, data.train_batch_size)
        tag_domains(dict(data.domain_tags))
    except DomainError as err:
        problems.add(str(err))
    if data.custom_cls.path:
        problems.add(
            "data.domain_quotas needs hybrid's own dataset (its rows carry the domains); unset data.custom_cls"
        )
    if scorers:
        if data.reward_fn_key != DOMAIN_COLUMN:
            problems.add(
                f"data.domain_scorers routes each row by its domain: set data.reward_fn_key={DOMAIN_COLUMN} "
                f"(it is {data.reward_fn_key!r})"
            )
        missing = [d for d in quotas if d not in scorers and d not in judged]
        if missing:
            problems.add(
                f"data.domain_scorers names no scorer for domain(s) {', '.join(missing)} of data.domain_quotas"
            )


def check_judge_domains(config, problems) -> None:
    """The rules of a judge limited to some domains (reward_model.judge.domains): it is the
    reward loop's judge, its domains are quota domains that no rule scorer also scores, and the
    other rows keep their reward-function score (combine=sum)."""
    rm, data = config.reward_model, config.data
    domains = rm.judge.domains
    check_domain_settings(data, problems, judged=tuple(domains or ()))
    if domains is None:
        return
    key = "reward_model.judge.domains"
    if not domains:
        problems.add(f"{key}=[] judges no row: list the domains to judge, or null to judge every row")
        return
    if not (rm.enable and rm.use_reward_loop):
        problems.add(
            f"{key} is read by the reward loop's judge: set reward_model.enable=true and "
            "reward_model.use_reward_loop=true, or unset it"
        )
    if rm.combine != "sum":
        problems.add(
            f"{key}: the other domains' rows are scored by their rule scorers alone, which "
            f"reward_model.combine={rm.combine} would drop; set it to sum"
        )
    quotas = dict(data.domain_quotas)
    unknown = [d for d in domains if d not in quotas]
    if unknown:
        problems.add(
            f"{key}: {', '.join(unknown)} not among data.domain_quotas' domains ({', '.join(quotas) or 'none'})"
        )
    if data.reward_fn_key != DOMAIN_COLUMN:
        problems.add(
            f"{key} reads each row's domain: set data.reward_fn_key={DOMAIN_COLUMN} (it is {data.reward_fn_key!r})"
        )
    both = [d for d in domains if d in dict(data.domain_scorers)]
    if both:
        problems.add(
            f"{key} and data.domain_scorers both score domain(s) {', '.join(both)}: keep one (the judge's rows get "
            "no rule score)"
        )


__all__ = [
    "check_judge_domains",
    "DOMAIN_COLUMN",
    "DomainError",
    "DomainQuotaSampler",
    "TAG_COLUMN",
    "VISION_TAG_COLUMN",
    "assign_domains",
    "check_domain_settings",
    "domain_quotas",
    "tag_domains",
]
