"""Elastic mode (host discovery, blacklisting, re-rendezvous): not available yet in this release.

``horovodrun --min-np ...`` and ``--host-discovery-script`` are parsed and rejected with an explanation
(see :data:`horovod.runner.launch.ELASTIC_NOT_AVAILABLE`).
"""
