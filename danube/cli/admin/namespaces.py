"""`danube admin namespaces` (to be filled in by the admin issue's work)."""


def add_parser(groups):
    groups.add_parser("namespaces", help="(not yet available)")
