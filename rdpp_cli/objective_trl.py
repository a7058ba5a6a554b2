"""R-DPP (or SCST-mean) as a reward function of TRL's ``GRPOTrainer``.

::

    from rdpp_cli.objective import Objective, trl_reward

    objective = Objective.from_references(references, reward="dpp", m=5)
    trainer = GRPOTrainer(model=..., reward_funcs=trl_reward(objective), train_dataset=dataset,  # an "image_id" column
                          args=GRPOConfig(num_generations=5, scale_rewards="none", loss_type="dapo", ...))

TRL calls a reward function with ``prompts``, ``completions``, ``completion_ids`` and the dataset's
other columns (one value per completion) and wants one number per completion, in its order. Its
sampler repeats each prompt ``num_generations`` times in a row, so each image's completions arrive
consecutively: :func:`trl_reward` cuts them into R-DPP sets of ``m`` (``num_generations`` a
multiple of ``m``), scores each set with :meth:`Objective.weights` against the references of the
image named by the ``image_column`` column, and returns the weights. What GRPO then trains is
docs/api.md's "Inside TRL's GRPOTrainer": its group normalisation subtracts each group's mean, so
the objective is R-DPP with the mean baseline, under TRL's loss normalisation.

It refuses, in one line, a call whose completions cannot be cut into whole sets of one image each:
a number of generations that is not a multiple of ``m``, and an image's set split between two
processes (or two calls).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rdpp_cli.errors import RdppError

if TYPE_CHECKING:
    from rdpp_cli.objective import Objective

__all__ = ["TRLReward", "trl_reward", "completion_text"]

_FIX = ("set GRPOConfig(num_generations=) to a multiple of m and per_device_train_batch_size x "
        "steps_per_generation to a multiple of num_generations")


def completion_text(completion: Any) -> str:
    """A completion's text: a string (standard format) or, in TRL's conversational format, the text
    of its last message (its content a string or a list of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RdppError(f"completion {completion!r:.60} is neither text nor a list of chat messages (trl_reward); "
                    "pass GRPOTrainer a text or conversational dataset")


class TRLReward:
    """The reward function :func:`trl_reward` returns: ``reward(prompts, completions, **columns)``
    -> one float per completion, in TRL's order. ``last`` holds the :class:`Weights` of each set of
    the latest call (their ``weights`` are the rewards returned, set after set)."""

    def __init__(self, objective: "Objective", image_column: str) -> None:
        if objective.spec.greedy:
            raise RdppError(f"reward {objective.reward} needs each image's greedy caption, which GRPOTrainer does "
                            "not produce (trl_reward); use reward='dpp' or 'scst-mean'")
        self.objective, self.image_column = objective, image_column
        self.__name__ = f"rdpp_{objective.reward}"  # TRL's name for the reward in its logs
        self.last: list[Any] = []

    @property
    def m(self) -> int:
        return self.objective.m

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                 **columns: Any) -> list[float]:
        if self.image_column not in columns:
            given = sorted(k for k in columns if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
            raise RdppError(f"no {self.image_column!r} column among the dataset's columns {given} (trl_reward); "
                            "add each row's image id as that column or pass image_column=")
        images = [_key(i) for i in columns[self.image_column]]
        sets = image_sets(images, self.m)
        texts = [completion_text(c) for c in completions]
        keys = [images[s] for s in sets]
        w = self.objective.weights(keys, [texts[s:s + self.m] for s in sets])
        self.last = [w]
        log_metric = columns.get("log_metric")
        if callable(log_metric):
            for name, value in w.logs.items():
                log_metric(f"rdpp/{name}", value)
        return [float(x) for x in w.weights.reshape(-1)]


def image_sets(images: Sequence[Hashable], m: int) -> list[int]:
    """The first index of each set of ``m`` consecutive completions of one image, refusing a call
    that cannot be cut so: its images' runs (consecutive completions of one image) must each hold a
    multiple of ``m``."""
    runs: list[tuple[int, int]] = []  # (start, length)
    for i, key in enumerate(images):
        if runs and images[runs[-1][0]] == key:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    for k, (start, n) in enumerate(runs):
        if n % m == 0:
            continue
        key = images[start]
        if 0 < k < len(runs) - 1 or len(runs) == 1:
            raise RdppError(f"image {key!r} has {n} completions in a row, not a multiple of m={m} (trl_reward): "
                            f"the number of generations must be a multiple of m; {_FIX}")
        raise RdppError(f"only {n} of image {key!r}'s completions are in this call, the rest on another process "
                        f"(trl_reward): an R-DPP set of m={m} would be split; {_FIX}")
    return [s for start, n in runs for s in range(start, start + n, m)]


def trl_reward(objective: "Objective", *, m: int | None = None, image_column: str = "image_id") -> TRLReward:
    """A ``GRPOTrainer`` reward function scoring each image's completions in R-DPP sets of ``m``
    (default: the objective's) with :meth:`Objective.weights`; ``image_column``: the dataset column
    holding each row's image id (a key of the objective's references)."""
    if m is not None and int(m) != objective.m:
        objective = replace(objective, m=int(m))
    return TRLReward(objective, image_column)


def _key(x: Any) -> Hashable:
    return x.item() if hasattr(x, "item") else x

