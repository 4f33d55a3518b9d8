"""Elastic mode's driver side (issue 14, in progress): host discovery and the blacklist are in
:mod:`.discovery`; the driver that starts and re-forms workers is still to come, so ``horovodrun --min-np ...`` and
``--host-discovery-script`` are still parsed and rejected with an explanation (see
:data:`horovod.runner.launch.ELASTIC_NOT_AVAILABLE`).
"""
