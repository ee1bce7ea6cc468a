"""The REST front door: routes, request/response schemas, the error table."""
