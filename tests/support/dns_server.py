#!/usr/bin/env python3
"""A tiny authoritative DNS server for the doctor tests (dnslib; installed
by scripts/install-deps.sh). Usage: dns_server.py ZONE.json [QUESTIONS.log]

ZONE.json: {"NAME": {"TXT": ["value", ...], "MX": [[pref, "host"], ...]}}.
Binds UDP and TCP on 127.0.0.1 at one free port, prints the port on the
first line of stdout, and answers until killed: the records asked for,
NXDOMAIN for a name it does not hold, an empty answer for a type it lacks.
The zone file is read again on every question, so a test may rewrite it.
With QUESTIONS.log, each question is appended to it as "NAME TYPE".
"""
import json
import socket
import sys

from dnslib import MX, QTYPE, RCODE, RR, TXT, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class ZoneResolver(BaseResolver):
    def __init__(self, path, log=None):
        self.path = path
        self.log = log

    def resolve(self, request, handler):
        with open(self.path) as f:
            zone = {k.lower().rstrip("."): v for k, v in json.load(f).items()}
        reply = request.reply()
        name = str(request.q.qname).lower().rstrip(".")
        qtype = QTYPE[request.q.qtype]
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{name} {qtype}\n")
        if name not in zone:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for value in zone[name].get(qtype, []):
            if qtype == "TXT":
                chunks = [value[i:i + 255] for i in range(0, len(value), 255)] or [""]
                rdata = TXT(chunks)
            elif qtype == "MX":
                rdata = MX(value[1], value[0])
            else:
                continue
            reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=60))
        return reply


def free_port():
    # the same port free for UDP and TCP
    while True:
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
        except OSError:
            t.close()
            continue
        t.close()
        u.close()
        return port


def main():
    resolver = ZoneResolver(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    port = free_port()
    # quiet: the test reads only the port line, then closes our stdout
    quiet = DNSLogger(logf=lambda *_: None)
    udp = DNSServer(resolver, port=port, address="127.0.0.1", logger=quiet)
    tcp = DNSServer(resolver, port=port, address="127.0.0.1", tcp=True, logger=quiet)
    udp.start_thread()
    tcp.start_thread()
    print(port, flush=True)
    sys.stdin.read()  # until the test closes our stdin or kills us


if __name__ == "__main__":
    main()
