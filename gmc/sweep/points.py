"""A sweep's points and the paths that name them.

A point is ``algo~A/delay~D/group~G/seed~S`` under ``<results>/train`` (a run directory) and
``<results>/eval`` (its evaluation): one pattern, read by the workflow's rules (with Snakemake
wildcards) and by the analysis (to parse a path back). Its delay is a :class:`Delay`: a fixed
delay ``d`` (``delay~64``), a named delay mode (``delay~latency``, ``delay~ray``: the settings of
the config section of that name) or a recorded staleness trace, replayed (``delay~trace-<name>``:
the ``traces`` section names its file). No torch is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gmc.rollouts.delays import DELAY_MODES, named_delays

POINT = "algo~{algo}/delay~{delay}/group~{group}/seed~{seed}"
"""A sweep point's path; the names in braces are the workflow's wildcards."""

_POINT_RE = re.compile(r"algo~(?P<algo>[^/]+)/delay~(?P<delay>[^/]+)/group~(?P<group>\d+)/seed~(?P<seed>\d+)")

TRACE_PREFIX = "trace-"
"""``delay~trace-<name>``: the trace ``<name>`` of the config's ``traces`` section, replayed."""

ALGO_WILDCARD = r"[a-z][a-z0-9_]*"
"""Estimator names as they may appear in paths (``seq_mask``)."""

_FIXED = r"0|[1-9][0-9]*"
"""A fixed delay as paths write it: a number in ASCII digits, without leading zeros."""


@dataclass(frozen=True)
class Delay:
    """The delay of a sweep point, parsed once from how paths write it (:meth:`parse`): a fixed
    delay (``fixed`` holds ``d``), a named delay mode of :data:`gmc.rollouts.delays.DELAY_MODES`
    (``mode``) or a replayed trace (``trace`` holds its name). ``str()`` gives it back as paths
    write it."""

    mode: str
    """``fixed``, ``trace`` or the name of a named delay mode."""
    fixed: int | None = None
    """The fixed delay ``d`` (batches in the queue); None for the other delays."""
    trace: str | None = None
    """The trace's name in the config's ``traces`` section; None for the other delays."""

    @classmethod
    def parse(cls, text: str | int | Delay) -> Delay:
        """The delay a path writes as ``text``: a number ``d``, a named delay mode or
        ``trace-<name>``; anything else is a ValueError naming what a delay may be."""
        if isinstance(text, Delay):
            return text
        text = str(text)
        if text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0")):
            return cls("fixed", fixed=int(text))
        if text in named_delays():
            return cls(text)
        if text.startswith(TRACE_PREFIX) and len(text) > len(TRACE_PREFIX):
            return cls("trace", trace=text.removeprefix(TRACE_PREFIX))
        raise ValueError(
            f"delay~{text}: neither a number, a named delay mode {named_delays()} nor {TRACE_PREFIX}<name>"
        )

    @classmethod
    def wildcard(cls) -> str:
        """The regular expression of every delay a path may write."""
        return "|".join([_FIXED, *named_delays(), rf"{TRACE_PREFIX}[A-Za-z0-9_]+"])

    def __str__(self) -> str:
        if self.mode == "fixed":
            return str(self.fixed)
        if self.mode == "trace":
            return f"{TRACE_PREFIX}{self.trace}"
        return self.mode

    @property
    def is_fixed(self) -> bool:
        return self.mode == "fixed"

    @property
    def order(self) -> tuple[int, int, str]:
        """Sort key: fixed delays ascending, then the named delay modes in registry order
        (:data:`gmc.rollouts.delays.DELAY_MODES`), then the traces by name."""
        if self.mode == "fixed":
            return (0, self.fixed, "")
        if self.mode == "trace":
            return (2, 0, str(self))
        return (1, named_delays().index(self.mode), "")

    @property
    def title(self) -> str:
        """``delay d = 8``, a delay mode's label, or ``replayed trace <name>``."""
        if self.mode == "fixed":
            return f"delay d = {self.fixed}"
        if self.mode == "trace":
            return f"{DELAY_MODES['trace'].label} {self.trace}"
        return DELAY_MODES[self.mode].label


def delay_order(delay: str | Delay) -> tuple[int, int, str]:
    """The sort key (:attr:`Delay.order`) of a delay as paths and tables write it."""
    return Delay.parse(delay).order


def is_fixed(delay: str | Delay) -> bool:
    """Whether a delay as paths and tables write it is a fixed delay ``d``."""
    return Delay.parse(delay).is_fixed


class Point(NamedTuple):
    """One sweep point: estimator (or variant), :class:`Delay`, group size, seed."""

    algorithm: str
    delay: Delay
    group: int
    seed: int

    @property
    def path(self) -> str:
        """``algo~A/delay~D/group~G/seed~S``, relative to ``train/`` or ``eval/``."""
        return POINT.format(algo=self.algorithm, delay=self.delay, group=self.group, seed=self.seed)

    @classmethod
    def of(cls, algorithm: str, delay: str | int | Delay, group: int | str, seed: int | str) -> Point:
        """A point from its parts as paths and wildcards write them."""
        return cls(algorithm, Delay.parse(delay), int(group), int(seed))

    @classmethod
    def find(cls, path: str | Path) -> Point | None:
        """The sweep point a path lies in; None outside a sweep (a folder whose delay is none a
        sweep writes, ``delay~64_old``, included)."""
        m = _POINT_RE.search(Path(path).as_posix())
        if m is None:
            return None
        try:
            return cls.of(m["algo"], m["delay"], m["group"], m["seed"])
        except ValueError:
            return None

    @classmethod
    def parse(cls, path: str | Path) -> Point:
        """The sweep point a path lies in; a ValueError outside a sweep."""
        point = cls.find(path)
        if point is None:
            raise ValueError(f"{path}: not a sweep point ({POINT})")
        return point

    def fields(self) -> dict:
        """``{"algorithm", "delay", "group", "seed"}`` with the delay as paths write it: a results
        table's columns."""
        return {"algorithm": self.algorithm, "delay": str(self.delay), "group": self.group, "seed": self.seed}
