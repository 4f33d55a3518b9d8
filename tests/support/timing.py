"""How much a busy machine may add to a duration that a test bounds from above.

A test that bounds a duration from above (a stall reported soon after its check time, a dead rank noticed
within seconds, a sleeper woken at once) checks that something happens promptly rather than at a default
period or never. It must not fail because the 2-core CI machine, running 3 or 4 ranks, kept a thread off a core
for a while. Such a bound is the configured time plus ``SLACK_S``, and the test makes sure that the slow
outcome it guards against (the default period, a timeout) lies well beyond that sum, so that a pass still
means "prompt" and a failure still means a bug, never load.
"""

SLACK_S = 4.0
