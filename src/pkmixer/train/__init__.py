"""Training: the config (:mod:`.config`), what a run is built from (:mod:`.build`, :mod:`.feeds`), its steps
(:mod:`.engine`), evaluation (:mod:`.evaluation`), the run and its directory (:mod:`.run`, :mod:`.rundir`), and the
two loops over runs: one run (:mod:`.loop`) and K runs as one stacked model (:mod:`.stacked_runs`, on
:mod:`.stack`)."""
