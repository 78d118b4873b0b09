#!/usr/bin/env python3
"""Prints N distinct free loopback TCP ports on one line, for scripts that
start services on ports of their own (scripts/demo.sh,
scripts/eval_wide_pair.sh). The sockets are held until all N are bound, so
the ports differ; another process may still take one before it is used.

  scripts/free_ports.py N
"""
import socket
import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    if not 1 <= n <= 64:
        sys.exit(f"free_ports.py: N must be 1..64, got {n}")
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    print(*[s.getsockname()[1] for s in socks])


if __name__ == "__main__":
    main()
