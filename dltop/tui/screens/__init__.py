"""Modal screens: help and confirmation."""
