"""``trainfit ui``: a local web app over the same commands the CLI runs.

One process on one port (Flask, server-rendered pages, a few lines of script shipped here; nothing
fetched at run time): a spec's knobs as controls made from :data:`trainfit.params.KNOBS` with live
validation by the spec's loader, the actions (analyze, probe, tune, ablate, compare, plan, train)
started as ``trainfit`` child processes that outlive the UI, their logs live, Stop and Resume, and
every run folder under the root with its status, its pages, and two side by side.

The rooms: ``paths`` (the root and the one path check), ``forms`` (the knob controls), ``specs``
(finding, validating, saving specs), ``commands`` (each action's command line), ``jobs`` and
``supervise`` (the child processes and their records), ``runs`` (run folders), ``app``,
``spec_views`` and ``job_views`` (the routes), ``server`` (serving it). Flask is an extra
(``pip install 'trainfit[ui]'``): only ``app``, the views and ``server`` import it.
"""
