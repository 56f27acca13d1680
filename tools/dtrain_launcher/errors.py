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


def shown(text: str, limit: int = 80, quote: str = "'") -> str:
    """`text` quoted for a message: characters that would not print as themselves (control
    characters, bytes that were not UTF-8) escaped as in Python, and cut after `limit` characters,
    so that a value from a hostfile or the environment cannot garble or flood the message."""
    escaped = "".join(c if c.isprintable() and c.isascii() else repr(c)[1:-1] for c in
                      text[:limit])
    more = f"... ({len(text)} characters)" if len(text) > limit else ""
    return f"{quote}{escaped}{quote}{more}"
