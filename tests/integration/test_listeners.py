"""Nothing the default `sloserve serve` starts listens beyond 127.0.0.1.

The gateway and every process of its embedded Ray (GCS, raylet, agents, workers, the Serve controller
and replicas) are in the server's process group: every socket they listen on is on a loopback
address, and a connection to each of those ports through the host's own network address is refused.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil
import pytest

pytestmark = pytest.mark.integration


def listeners(pgid: int) -> list[tuple[str, str, int]]:
    """(process, address, port) of every listening TCP socket in the process group."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) != pgid:
                continue
            name = " ".join(p.cmdline()[:3])[:80]
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.append((name, c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return out


def host_address() -> str | None:
    """This host's own non-loopback address (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(ip).is_loopback else ip


def test_the_default_server_and_its_ray_listen_on_loopback_only(servers):
    srv = servers("ray")
    found = listeners(os.getpgid(srv.proc.pid))
    ports = {port for _, _, port in found}
    assert srv.http_port in ports and srv.grpc_port in ports, found
    assert len({name for name, _, _ in found}) >= 3, f"expected Ray's processes in the group too: {found}"
    beyond = [x for x in found if not ipaddress.ip_address(x[1]).is_loopback]
    assert not beyond, f"listening beyond loopback: {beyond}"
    host = host_address()
    if host is None:
        pytest.skip("this host has no non-loopback address to connect from")
    for name, _, port in found:
        with socket.socket() as s:
            s.settimeout(2)
            with pytest.raises(OSError):
                s.connect((host, port))
                pytest.fail(f"{name} answered on {host}:{port}")
