"""The web console's static files (served by :mod:`sandboxd.routes.console`)."""
