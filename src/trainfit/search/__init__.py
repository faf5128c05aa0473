"""Search for the fastest configuration that fits, as ask/tell: ``strategies`` (what to probe next),
``study`` (the persistent trial store), ``ranking`` (which measured config is best) and ``loop``
(``open_search``: ask, probe, tell, repeat, yielding each measured trial). It writes nothing but its
study and knows nothing of ``tune``, which writes the outputs from what it yields. The space searched
is ``trainfit.space``, part of the spec. Nothing is imported here, so importing one search module does
not import the others."""
