# cython: language_level=3
"""Hot paths of the broker: HTTP/2 frame codec, gRPC length-prefix framing, CRC32C, fan-out.

One extension module built from several include files, one per concern, so that the C-level
helpers can call each other without Python overhead.
"""

include "_core_src/crc32c.pxi"
include "_core_src/h2codec.pxi"
include "_core_src/grpcframe.pxi"
include "_core_src/canon.pxi"
include "_core_src/fanout.pxi"
include "_core_src/stamp.pxi"
