"""Infrastructure: the database engine and the embedded PostgreSQL server."""
