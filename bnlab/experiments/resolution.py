"""What an entry's smoke preset can decide, stated in the entry before it runs:
the paper's effect, the effect the smoke resolves, and the pilot or computation behind that number.
Entries with a pre-declared :class:`verdicts.Design` or :class:`common.DesignSD` build it from that
(:func:`design_resolution`, :func:`family_resolution`), so the number is written once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .verdicts import DesignSD, design_mde, fewest_seeds

if TYPE_CHECKING:
    from .verdicts import Design


@dataclass(frozen=True)
class Resolution:
    """What an entry's smoke preset can decide, stated in the entry before it runs:
    the effect the paper reports, the effect the proxy resolves, and the pilot (or computation)
    that set that number. The report prints it above the verdict, ``bnlab experiments list`` beside
    the claim."""

    paper: str       # the paper's effect: a number with its table/figure, or "direction only: ..."
    resolvable: str  # the smallest effect (or tolerance) the smoke design resolves, with units
    pilot: str       # where that number comes from: a named pilot, a simulation, a computation

    def __post_init__(self):
        for name in ("paper", "resolvable", "pilot"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Resolution.{name} must be a non-empty string, got {value!r}")

    def text(self) -> str:
        return (f"paper: {self.paper}; the smoke resolves {self.resolvable} "
                f"(from {self.pilot})")


def design_resolution(design: Design, *, paper: str | None = None, scale: float = 1.0,
                      unit: str = "") -> Resolution:
    """The entry's :class:`base.Resolution` from its :class:`Design`: the paper's effect (``paper``,
    or the design's signed effect / direction), the design's resolvable effect at its seeds and,
    where that is larger than a known paper effect, the seeds per arm that would resolve it."""
    if paper is None:
        paper = (f"{scale * design.paper_effect:+.3g}{unit} ({design.quantity})"
                 if design.magnitude_known else
                 f"direction only: {design.quantity} "
                 + ("lower" if design.paper_effect < 0 else "higher"))
    resolvable = f"≥ {scale * design.mde():.2g}{unit} with {design.n_seeds} seeds per arm"
    if design.magnitude_known and not design.resolves_paper():
        needed = design.seeds_to_resolve()
        resolvable += (f" (the paper's effect needs {needed} seeds per arm)" if needed else
                       " (no number of seeds resolves the paper's effect: the SE floor is "
                       "above it)")
    return Resolution(paper, resolvable,
                      f"design SD {scale * design.design_sd:.2g}{unit}, {design.source}")


def family_resolution(paper: str, design_sd: DesignSD, n_seeds: int, *, unit: str = "",
                      scale: float = 1.0, smallest_effect: float | None = None) -> Resolution:
    """The :class:`base.Resolution` of a conjunctive or family claim from its
    :class:`common.DesignSD`: each comparison's resolvable effect at ``n_seeds`` per arm
    (:func:`common.design_mde`, without a floor), the pilot as the source. ``smallest_effect``
    (the paper's smallest judged effect, in the design SD's units): where the design does not
    resolve it, the seeds per arm that would."""
    keys = list(design_sd.sd) if isinstance(design_sd.sd, dict) else [None]
    mdes = {k: scale * design_mde(design_sd.of(k), n_seeds, n_seeds) for k in keys}
    parts = [("" if k is None else f"{k} ") + f"≥ {mde:.2g}" for k, mde in mdes.items()]
    resolvable = "; ".join(parts) + f"{unit} with {n_seeds} seeds per arm"
    value_unit = unit.split(" per ")[0]  # " points per activation" → " points"
    if smallest_effect is not None:
        widest = max(design_sd.of(k) for k in keys)
        needed = fewest_seeds(lambda n: design_mde(widest, n, n), smallest_effect)
        if needed is not None and needed > n_seeds:
            resolvable += (f" (the paper's smallest judged effect, {scale * smallest_effect:+.3g}"
                           f"{value_unit}, needs {needed} seeds per arm)")
    sd_unit = "" if isinstance(design_sd.sd, dict) else value_unit
    return Resolution(paper, resolvable, design_sd.text(scale, sd_unit))
