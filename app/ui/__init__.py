"""The dashboard at /ui: pages with a small script of their own (no build step,
no CDN) that read and change queues through the REST API with the key the user
signed in with, kept in an HttpOnly cookie."""
