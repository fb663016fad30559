# StreamMessage and MsgID (protocol/DanubeApi.proto) as the Cython modules that read and
# write them without protobuf objects see them: field numbers and the tags the canonical form
# writes. The one place for this layout; broker/_canon, _stamp, _columns, client/_delivery
# and codec/mqtt cimport it. A field added to the .proto is added here first.

cdef enum:
    # StreamMessage
    SM_REQUEST_ID = 1           # uint64
    SM_MSG_ID = 2               # MsgID
    SM_PAYLOAD = 3              # bytes
    SM_PUBLISH_TIME = 4         # uint64
    SM_PRODUCER_NAME = 5        # string
    SM_SUBSCRIPTION_NAME = 6    # string
    SM_ATTRIBUTES = 7           # map<string, string>: repeated entries
    SM_SCHEMA_ID = 8            # optional uint64
    SM_SCHEMA_VERSION = 9       # optional uint32
    SM_ROUTING_KEY = 10         # optional string
    SM_LAST_FIELD = 10
    SM_FIRST_OPTIONAL = 8       # 8..10 are proto3 optional: present means sent, even if 0

    # MsgID (field 4, the old segment_id, is unused)
    MID_PRODUCER_ID = 1         # uint64
    MID_TOPIC_NAME = 2          # string
    MID_BROKER_ADDR = 3         # string
    MID_TOPIC_OFFSET = 5        # uint64

    # A map entry (attributes)
    ENTRY_KEY = 1
    ENTRY_VALUE = 2

    # Tags (field number << 3 | wire type) the writers emit
    TAG_SM_MSG_ID = (SM_MSG_ID << 3) | 2
    TAG_SM_PAYLOAD = (SM_PAYLOAD << 3) | 2
    TAG_SM_PUBLISH_TIME = (SM_PUBLISH_TIME << 3) | 0
    TAG_SM_PRODUCER_NAME = (SM_PRODUCER_NAME << 3) | 2
    TAG_MID_PRODUCER_ID = (MID_PRODUCER_ID << 3) | 0
    TAG_MID_TOPIC_NAME = (MID_TOPIC_NAME << 3) | 2
    TAG_MID_BROKER_ADDR = (MID_BROKER_ADDR << 3) | 2
    TAG_MID_TOPIC_OFFSET = (MID_TOPIC_OFFSET << 3) | 0
