"""One module per cache layer; each reads the system once and returns its Snapshot part. No Textual here."""
