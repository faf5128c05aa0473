"""Search for the fastest configuration that fits: ``space`` (what is searched), ``strategies``
(what to probe next), ``study`` (the persistent trial store) and ``tune`` (the loop; call
``trainfit.search.tune.tune``). Nothing is imported here, so ``trainfit.report`` and the
search modules can import each other's pieces in any order."""
