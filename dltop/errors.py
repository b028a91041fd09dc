"""The one exception type that the CLI turns into a one-line message and a non-zero exit."""


class DltopError(Exception):
    """A problem the user can fix (bad path, bad config, no permission); its text is the whole message."""

    exit_code = 1


class UsageError(DltopError):
    """A command line that cannot mean anything (an unknown subcommand); exit status 2 like argparse's errors."""

    exit_code = 2
