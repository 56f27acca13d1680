#!/usr/bin/env python3
"""One TCP stream across a link, timed at the receiving end (netns_cluster.measure_throughput).

    link_probe.py serve --bind ADDR --port P
        prints "ready", receives one stream, then prints
        {"bytes": ..., "seconds": ..., "bits_per_second": ...}
    link_probe.py send --to ADDR --port P --seconds S

The receiver times from the first byte to the last, so the sender's start-up is not counted,
and what a shaper queued is counted when it arrives, not when it was sent.
"""
import argparse
import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(args):
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.bind, args.port))
        listener.listen(1)
        listener.settimeout(args.timeout)
        print("ready", flush=True)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(args.timeout)
            buffer = bytearray(CHUNK)
            total, first, last = 0, None, None
            while True:
                n = conn.recv_into(buffer)
                if n == 0:
                    break
                last = time.perf_counter()
                if first is None:
                    first = last
                    n_first = n
                total += n
    if first is None or last <= first:
        sys.exit("link_probe: too little data to time")
    # The first read's bytes arrived before the clock started.
    seconds = last - first
    bits = 8 * (total - n_first)
    print(json.dumps({"bytes": total, "seconds": seconds, "bits_per_second": bits / seconds}))


def send(args):
    payload = bytes(CHUNK)
    with socket.create_connection((args.to, args.port), timeout=30) as conn:
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            conn.sendall(payload)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--timeout", type=float, default=60)
    c = sub.add_parser("send")
    c.add_argument("--to", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    serve(args) if args.mode == "serve" else send(args)


if __name__ == "__main__":
    main()
