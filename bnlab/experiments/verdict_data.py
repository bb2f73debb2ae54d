"""An entry's verdict as data: what its judging step decided, beside the summary text it writes.

:class:`Verdict` holds the primary comparison the verdict rests on (its name, our effect with its
interval and p, the seeds per arm, the effect the design resolves, the paper's number), the verdict
and the rule that turned those numbers into it (:data:`bnlab.experiments.verdicts.RULE` for a
:class:`~bnlab.experiments.verdicts.Design`, :data:`~bnlab.experiments.verdicts.COMPARE_RULE` for
a comparison of :func:`~bnlab.experiments.verdicts.compare_arms`). It is stored with the entry's
runs when the entry is analysed (:meth:`bnlab.store.Store.save_outcome`), so the report, the README
builder and ``bnlab experiments show ID --json`` read it instead of analysing the entry again or
parsing its summary. An entry that does not return one yet gets :meth:`Verdict.text_only`: the
verdict and the rule, its numbers in its summary only (``structured`` False).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .verdicts import ALPHA, COMPARE_RULE

#: Version of :class:`Verdict`'s stored fields (:meth:`Verdict.to_dict`); a newer one is refused.
VERDICT_SCHEMA = 1


def _number(value: Any) -> float | None:
    """A finite float, or None (NaN and ±inf are not numbers a reader can use)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Verdict:
    """One entry's verdict and the primary comparison behind it (numbers in the primary's units,
    times the entry's display ``scale``; ``unit`` names them)."""

    verdict: str
    rule: str
    primary: str | None = None                   # what is compared (b − a), as the entry names it
    effect: float | None = None                  # our b − a
    interval: tuple[float, float] | None = None  # its (1 − α) confidence interval
    p: float | None = None                       # two-sided p of the test
    seeds: tuple[int, int] | None = None         # seeds per arm (a, b)
    resolvable: float | None = None              # the smallest effect the design resolves
    paper: float | str | None = None             # the paper's b − a, or its direction in words
    unit: str = ""
    structured: bool = True                      # False: the numbers are in the summary only

    @classmethod
    def text_only(cls, verdict: str, rule: str) -> "Verdict":
        """The verdict of an entry that states its evidence only in its summary text."""
        return cls(verdict, rule, structured=False)

    @classmethod
    def from_judgement(cls, verdict: str, judged, design, *, rule: str,
                       scale: float = 1.0, unit: str = "") -> "Verdict":
        """From :func:`verdicts.judge`'s :class:`~bnlab.experiments.verdicts.Judgement` of
        ``design`` (the entry's :class:`~bnlab.experiments.verdicts.Design`); ``verdict``: the
        entry's final one (its ladder and settling may overrule the primary's own)."""
        ci = judged.ci
        paper = (scale * design.paper_effect if design.magnitude_known else
                 ("lower" if design.paper_effect < 0 else "higher") + " (direction only)")
        return cls(verdict, rule, design.quantity, _scaled(judged.diff, scale),
                   None if ci is None else (scale * ci[0], scale * ci[1]), _number(judged.p),
                   (judged.n_a, judged.n_b), _scaled(judged.mde, scale), paper, unit)

    @classmethod
    def from_comparison(cls, verdict: str, name: str, comparison, *, paper: float | str | None,
                        rule: str = COMPARE_RULE, scale: float = 1.0, unit: str = "",
                        alpha: float = ALPHA) -> "Verdict":
        """From a :class:`~bnlab.experiments.verdicts.Comparison` (b − a): its interval is
        diff ± t_{1−α/2, df}·SE (none without a test)."""
        c = comparison
        interval = None
        if c.diff is not None and c.se is not None:
            half = c.se * (_t_quantile(1 - alpha / 2, c.df) if c.df else 0.0)
            interval = (scale * (c.diff - half), scale * (c.diff + half))
        if isinstance(paper, (int, float)):
            paper = scale * paper
        return cls(verdict, rule, name, _scaled(c.diff, scale), interval, _number(c.p),
                   (c.n_a, c.n_b), _scaled(c.mde, scale), paper, unit)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields with the schema version (``"schema"``)."""
        out = asdict(self)
        for key in ("interval", "seeds"):
            out[key] = None if out[key] is None else list(out[key])
        return {"schema": VERDICT_SCHEMA, **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        """The inverse of :meth:`to_dict`; a newer schema or an unknown field is refused."""
        schema = data.get("schema")
        if schema != VERDICT_SCHEMA:
            raise ValueError(f"stored verdict has schema {schema!r}; this bnlab reads "
                             f"{VERDICT_SCHEMA} (re-analyse the entry: bnlab report)")
        known = {f.name for f in fields(cls)}
        extra = set(data) - known - {"schema"}
        if extra:
            raise ValueError(f"stored verdict has unknown fields {sorted(extra)}; known: "
                             f"{sorted(known)}")
        values = {k: v for k, v in data.items() if k in known}
        for key in ("interval", "seeds"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


def _scaled(value: float | None, scale: float) -> float | None:
    value = _number(value)
    return None if value is None else scale * value


def _t_quantile(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))
