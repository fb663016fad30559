"""`danube admin topics` (to be filled in by the admin issue's work)."""


def add_parser(groups):
    groups.add_parser("topics", help="(not yet available)")
