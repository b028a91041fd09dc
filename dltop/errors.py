"""The one exception type that the CLI turns into a one-line message and a non-zero exit."""


class DltopError(Exception):
    """A problem the user can fix (bad path, bad config, no permission); its text is the whole message."""

    exit_code = 1
