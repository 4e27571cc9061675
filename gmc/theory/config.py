"""The gradient lab's settings (:mod:`gmc.theory.gradients`), apart from the lab so that the
workflow reads them without torch or pandas."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gmc.estimators import REGISTRY
from gmc.settings import NonNegativeInt, PositiveInt, registered, settings

GroupSize = Annotated[int, Field(ge=2)]
Estimator = registered(lambda: REGISTRY, "estimator")


@settings(prefix="gradient_lab.")
class GradientLabConfig:
    """What the gradient lab measures (``gmc gradient-lab``, :mod:`gmc.theory.gradients`)."""

    delays: Annotated[tuple[NonNegativeInt, ...], Field(min_length=1)] = (16, 64)
    """Versions ``d`` between the behaviour and the current weights of each pair (0: the same
    weights, where every ratio is 1 and every estimator equals its target in expectation)."""
    group_sizes: Annotated[tuple[GroupSize, ...], Field(min_length=1)] = (2, 4, 8, 16, 32)
    """Group sizes ``G``: a batch holds one group of ``G`` answers per prompt."""
    prompts: PositiveInt = 8
    """Fixed training prompts of every batch (the expectation is over sampling alone): the first
    of a seeded shuffle of the training set on which a group of ``focus_group_size`` answers from
    the behaviour weights is neither all right nor all wrong. A prompt the policy always or never
    solves gives every estimator a zero gradient (all its advantages are 0), and after a history
    most prompts are such."""
    prompt_pool: PositiveInt = 512
    """Training prompts screened, at most, to find ``prompts`` such prompts."""
    batches: Annotated[int, Field(ge=4)] = 24
    """Independent batches per (pair, G): the repeats every interval comes from."""
    algorithms: Annotated[tuple[Estimator, ...], Field(min_length=1)] = ("grpo", "tic", "gmc", "is", "none")
    """Estimators measured at every pair and group size (``is`` is measured in any case: the
    excess of its class is measured against it)."""
    league: tuple[Estimator, ...] | None = None
    """Further estimators measured at the largest delay and ``focus_group_size`` only; None: every
    registered estimator not in ``algorithms``."""
    eps_values: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] = (0.05, 0.1, 0.2, 0.4, 0.8)
    """Caps ``1+eps`` at which ``tic`` and ``gmc`` are measured again, at the largest delay and
    ``focus_group_size`` (claim 1's eps dependence); every other row uses the history's eps."""
    focus_group_size: GroupSize = 8
    """The group size of the eps rows and of the league."""
    seed: int = 0
    """Seed of the prompts' choice and of the sampling."""

    def league_algorithms(self) -> list[str]:
        """The league's estimators (:attr:`league`, resolved)."""
        names = [a for a in REGISTRY if a not in self.algorithms] if self.league is None else self.league
        return [a for a in names if a not in self.algorithms and a != "is"]
