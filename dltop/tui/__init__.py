"""The Textual UI: the only package that imports textual. Panes render what they are handed."""
