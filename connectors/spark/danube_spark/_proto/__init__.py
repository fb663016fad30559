"""Generated at build time from protocol/*.proto (see setup.py); not in git."""
