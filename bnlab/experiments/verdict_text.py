"""How the verdict rule's numbers are written in a summary: the render step of an entry, apart from
the rule that decides (:mod:`bnlab.experiments.verdicts`). Each function here is the ``text`` of one
of the rule's objects (a :class:`~bnlab.experiments.verdicts.Comparison`, a
:class:`~bnlab.experiments.verdicts.DesignSD`, a :class:`~bnlab.experiments.verdicts.Design` and
its :class:`~bnlab.experiments.verdicts.Judgement`); numbers are multiplied by ``scale`` (100:
points) and followed by ``unit``."""

from __future__ import annotations


def comparison(c, scale: float = 1.0, unit: str = "") -> str:
    """``+3.1 ± 0.8 (SE; Welch p=0.01, n=3/3, resolvable ≥ 2.9)``."""
    if c.diff is None:
        return "no data"
    out = f"{scale * c.diff:+.3g}{unit}"
    if c.se is None:
        return out + f" (n={c.n_a}/{c.n_b}: too few seeds for a test)"
    out += f" ± {scale * c.se:.2g}{unit} (SE; Welch p={c.p:.2g}, n={c.n_a}/{c.n_b}"
    if c.mde is None:
        return out + ")"
    basis = "" if c.mde_basis == "observed SD" else f" at the {c.mde_basis}"
    return out + f", resolvable ≥ {scale * c.mde:.2g}{unit}{basis})"


def design_sd(d, scale: float = 1.0, unit: str = "") -> str:
    """``design SD 0.56 (smoke pilot …)``, or one SD per comparison key."""
    if isinstance(d.sd, dict):
        sds = ", ".join(f"{k} {scale * v:.2g}{unit}" for k, v in d.sd.items())
    else:
        sds = f"{scale * d.sd:.2g}{unit}"
    return f"design SD {sds} ({d.source})"


def paper_effect(design, scale: float = 1.0, unit: str = "", words=("lower", "higher")) -> str:
    """The paper's effect of ``design``: its number, or its direction where only that is known."""
    if design.magnitude_known:
        return f"{scale * design.paper_effect:+.3g}{unit}"
    return words[design.paper_effect > 0] + " (direction only)"


def design(d, scale: float = 1.0, unit: str = "") -> str:
    """``primary: Q; paper +6.1; design SD 1.2 (pilot), 5 seeds/arm → resolvable ≥ 2.4``."""
    return (f"primary: {d.quantity}; paper {paper_effect(d, scale, unit)}; design "
            f"SD {scale * d.design_sd:.2g}{unit} ({d.source}), {d.n_seeds} seeds/arm → "
            f"resolvable ≥ {scale * d.mde():.2g}{unit}")


def judgement(j, d, scale: float = 1.0, unit: str = "") -> str:
    """The primary comparison ``j`` of design ``d``: our effect ± SE, its interval, p and seeds,
    against the paper's, with the design's resolvable effect."""
    if j.diff is None or j.se is None:
        return f"{d.quantity}: n={j.n_a}/{j.n_b}, too few seeds ({design(d, scale, unit)})"
    lo, hi = j.ci
    return (
        f"{d.quantity} {scale * j.diff:+.3g}{unit} ± {scale * j.se:.2g} "
        f"(SE{', floored' if j.floored else ''}; {100 * (1 - d.alpha):g} % CI "
        f"[{scale * lo:+.3g}, {scale * hi:+.3g}], p={j.p:.2g}, n={j.n_a}/{j.n_b}) "
        f"vs the paper's {paper_effect(d, scale, unit, ('negative', 'positive'))}; "
        f"resolvable ≥ {scale * j.mde:.2g}{unit} (design SD {scale * d.design_sd:.2g}, {d.source})")


