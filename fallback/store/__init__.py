"""The SQLite store: connection and transactions, typed errors, migrations, files on disk, the writer lock, vectors."""
