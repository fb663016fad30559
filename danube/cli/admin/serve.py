"""`danube admin serve` (to be filled in by the admin issue's work)."""


def add_parser(groups):
    groups.add_parser("serve", help="(not yet available)")
