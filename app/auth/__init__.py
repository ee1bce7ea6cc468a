"""Who may do what: API keys, their scopes, and the checks both front doors make."""
