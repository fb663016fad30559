"""`danube admin schemas` (to be filled in by the admin issue's work)."""


def add_parser(groups):
    groups.add_parser("schemas", help="(not yet available)")
