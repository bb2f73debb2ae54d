"""A closed form checked against simulation: Luo et al.'s ζ (Eq. 13) against Monte Carlo.

    python examples/theory_against_simulation.py
    BNLAB_EXAMPLE_QUICK=1 python examples/theory_against_simulation.py   # fewer batches (the tests)

Luo et al., *Towards Understanding Regularization in Batch Normalization* (ICLR 2019,
arXiv:1809.00846), Eq. 13: the strength of the ridge penalty that BN's batch statistics impose on a
linear student, ζ/λ = E[(1 − σ_P/σ_B)²] over batches of M Gaussians, with large-M limit 1/(2M).
"""

import math
import os

from bnlab.theory import luo

QUICK = os.environ.get("BNLAB_EXAMPLE_QUICK") == "1"
N_BATCHES = 20_000 if QUICK else 400_000


def main() -> None:
    print(f"{'M':>4} {'Eq. 13':>9} {'Monte Carlo':>12} {'1/(2M)':>9}")
    for M in (8, 16, 32, 64):  # at M ≤ 4, 1/σ_B² has too heavy a tail for a quick Monte Carlo
        exact, limit = luo.zeta_linear(M), luo.zeta_linear_large_m(M)
        mc = luo.zeta_linear_mc(M, N_BATCHES, seed=M)
        print(f"{M:>4} {exact:>9.4f} {mc:>12.4f} {limit:>9.4f}")
        # the MC mean of a heavy-ish tailed quantity: allow a generous 5 % (plus an absolute floor)
        assert math.isclose(exact, mc, rel_tol=0.05, abs_tol=2e-3), (M, exact, mc)


if __name__ == "__main__":
    main()
