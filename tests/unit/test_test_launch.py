"""The test suite's own launch helper: a job whose Open MPI runtime failed to start is launched once more, and
the retry is recorded (the suite's summary lists it); any other failure is returned as it is."""
import subprocess

from tests.support import launch


def _launches(*outputs):
    calls = []

    def launch_once():
        calls.append(1)
        return subprocess.CompletedProcess(["mpirun"], 1 if "failed" in outputs[len(calls) - 1] else 0,
                                           outputs[len(calls) - 1], "")
    return launch_once, calls


def test_a_runtime_that_failed_to_start_is_launched_once_more_and_the_retry_recorded():
    retried = []            # not the suite's list, whose lines its summary prints as real retries
    launch_once, calls = _launches(f"...\n{launch.PMIX_START_FAILURE}. We cannot\ncontinue.\n", "1 passed")
    result = launch.with_runtime_start_retry(launch_once, "w.py at 4 ranks under mpirun", retried)
    assert result.returncode == 0 and len(calls) == 2
    assert retried == [f"w.py at 4 ranks under mpirun: {launch.PMIX_START_FAILURE}"]


def test_a_second_runtime_failure_and_any_other_failure_are_returned_as_they_are():
    retried = []
    failure = f"{launch.PMIX_START_FAILURE} (failed)"
    launch_once, calls = _launches(failure, failure, "never")
    assert launch.with_runtime_start_retry(launch_once, "job", retried).stdout == failure and len(calls) == 2
    launch_once, calls = _launches("1 failed", "never")
    assert launch.with_runtime_start_retry(launch_once, "job", retried).returncode == 1 and len(calls) == 1
    assert len(retried) == 1
