"""The entry of a rank other than 0 of ``trainfit train`` (``python -m trainfit.train.rank_child JOB``):
a module of its own, which the package does not import, so that Python runs it once
(:func:`trainfit.train.ranks.rank_main`)."""

from __future__ import annotations

import sys

from trainfit.train.ranks import rank_main

if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1]))
