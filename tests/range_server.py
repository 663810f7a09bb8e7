#!/usr/bin/env python3
"""An HTTP server of a directory's files with Range support (http.server has none), for the remote-input tests.

Prints "port N" on stdout once it listens (port 0: an ephemeral one). Answers HEAD and GET, with one
"bytes=a-b" range (206) or the whole file (200). --drop_after N: once N body bytes have been sent in all, every
response is cut (its headers promise more than is sent, then the connection closes), as a lost connection is.
--count FILE: the body bytes sent so far, rewritten after each response. --fail_first K: the first K requests are
answered 503 (Service Unavailable), as a busy object store answers.
"""
import argparse
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

ARGS = None
SENT = [0]
FAILED = [0]  # requests answered so far, the first --fail_first of them with 503
LOCK = Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as object stores do

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(body=False)

    def do_GET(self):
        self.answer(body=True)

    def answer(self, body):
        with LOCK:
            FAILED[0] += 1
            unavailable = FAILED[0] <= ARGS.fail_first
        if unavailable:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = os.path.join(ARGS.root, self.path.split("?", 1)[0].lstrip("/"))
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(path)
        first, last = 0, size - 1
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            first = int(match.group(1))
            last = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            if first >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if match else 200)
        if match:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as f:
            f.seek(first)
            data = f.read(last - first + 1)
        with LOCK:
            allowed = len(data) if ARGS.drop_after < 0 else max(0, min(len(data), ARGS.drop_after - SENT[0]))
            SENT[0] += allowed
            if ARGS.count:
                with open(ARGS.count + ".tmp", "w") as out:
                    out.write(str(SENT[0]))
                os.replace(ARGS.count + ".tmp", ARGS.count)
        self.wfile.write(data[:allowed])
        if allowed < len(data):
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--drop_after", type=int, default=-1)
    parser.add_argument("--count", default="")
    parser.add_argument("--fail_first", type=int, default=0)
    ARGS = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    print("port %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
