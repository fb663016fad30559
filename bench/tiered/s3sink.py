"""An S3 endpoint that stores nothing, for bench.tiered's publish section (`s3-sink`).

It answers a PUT (conditional or not) with 200 and an ETag once it has read the body, and
a listing with an empty result; it checks no signature. A broker uploading to it does every
part of an upload that is the broker's own (sealing, the upload worker reading and scanning
the segment, boto3 hashing, signing and sending every byte over loopback, the descriptor
written to metadata), while the store's own work (SeaweedFS receiving, hashing and storing
the object) is left out, as it would be with a store on other machines. Comparing the two
tells the broker's share of a publish-latency effect from the co-located server's.

    python -m bench.tiered.s3sink        # prints the port, serves until killed
"""

import http.server
import socketserver
import sys

_LIST = (b'<?xml version="1.0" encoding="UTF-8"?>'
         b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
         b'<Name>sink</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1</MaxKeys>'
         b'<IsTruncated>false</IsTruncated></ListBucketResult>')
_ETAG = '"d41d8cd98f00b204e9800998ecf8427e"'


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    puts = 0
    bytes = 0

    def log_message(self, *args):
        pass

    def _reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_PUT(self):
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                return
            left -= len(chunk)
            Handler.bytes += len(chunk)
        Handler.puts += 1
        self._reply(200, headers=[("ETag", _ETAG)])

    def do_GET(self):
        self._reply(200, _LIST, [("Content-Type", "application/xml")])

    def do_HEAD(self):
        self._reply(404)

    def do_DELETE(self):
        self._reply(204)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    sys.stdout.write(f"{server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
