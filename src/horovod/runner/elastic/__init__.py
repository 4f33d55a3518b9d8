"""Elastic mode's driver side: host discovery and the blacklist (:mod:`.discovery`), the settings
(:mod:`.settings`), the workers' states per round (:mod:`.registration`) and the driver that starts and re-forms
the workers (:mod:`.driver`). ``horovodrun --min-np ...`` and ``--host-discovery-script`` run through
:func:`horovod.runner.launch._run_elastic`.
"""
