"""Search for the fastest configuration that fits: ``strategies`` (what to probe next), ``study``
(the persistent trial store), ``ranking`` (which measured config is best) and ``loop`` (ask, probe, store,
repeat: ``run_search``; ``trainfit.tune`` runs it with the report's outputs). The space searched is
``trainfit.space``, part of the spec. Nothing is imported here, so importing one search module does
not import the others."""
