"""`leaseq doctor`: a deployment's settings and database checked (checks.py),
its statements in queries.sql."""
