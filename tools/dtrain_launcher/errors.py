"""Errors and exit codes shared by the launcher's parts."""

# Exit codes of dtrainrun itself. A failed rank's own exit code (or 128 + its signal number) is
# passed through unchanged; these are the cases where no rank's code describes what happened.
EXIT_USAGE = 2                 # bad arguments or environment: nothing was started
EXIT_RESTARTS_EXHAUSTED = 120  # --restarts K given and all K + 1 attempts failed
EXIT_NOT_STARTED = 121         # the job could not be set up (ranks never started, hosts never met)
EXIT_LEADER_LOST = 122         # cluster follower: the leader went away before reporting a status


class UsageError(Exception):
    """Bad arguments or environment, found before anything starts. The text is the whole message,
    starting with 'dtrain:'."""


class LaunchError(Exception):
    """The job could not be started. Carries the exit code dtrainrun ends with."""

    def __init__(self, message, exit_code=EXIT_NOT_STARTED):
        super().__init__(message)
        self.exit_code = exit_code
