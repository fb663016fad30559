"""`danube admin brokers` (to be filled in by the admin issue's work)."""


def add_parser(groups):
    groups.add_parser("brokers", help="(not yet available)")
