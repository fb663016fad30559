"""Status codes of the admin API where they differ from the client API's (services/errors.py).

Upstream wraps a failed topic or namespace operation as NOT_FOUND ("Unable to create the
topic ... due to ..."), an existing one as ALREADY_EXISTS, a bad name as INVALID_ARGUMENT.
Where upstream answers a missing object with an empty success (DescribeTopic,
ListSubscriptions, GetSubscriptionFailurePolicy of an unknown topic or subscription), we
answer NOT_FOUND naming it: an operator who mistypes a name learns so (docs/admin.md)."""

from danube.broker import errors as e
from danube.rpc import StatusCode

ADMIN_CODES = {e.InvalidTopicName: StatusCode.INVALID_ARGUMENT,
               e.NamespaceNotFound: StatusCode.NOT_FOUND,
               e.NamespaceNotEmpty: StatusCode.FAILED_PRECONDITION,
               e.SubscriptionNotFound: StatusCode.NOT_FOUND}
