"""torch.distributed gloo all_reduce over the interface the plugin chose
(GLOO_SOCKET_IFNAME from nccl_socket_net=): every rank checks that each of its
own TCP connections other than the store's (MASTER_ADDR:MASTER_PORT) has a
local address in $EXPECT_NET (a.b.c.0/24), on the interface the plugin named,
and rank 0 prints one `ok` line with each node's interface."""

import datetime
import ipaddress
import os
import socket
import sys

import torch
import torch.distributed as dist

from agree import report


def own_tcp():
    """(local, remote) (ip, port) pairs of this process's established TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])

    def addr(hexed):
        ip, port = hexed.split(":")
        return str(ipaddress.IPv4Address(socket.ntohl(int(ip, 16)))), int(port, 16)

    pairs = []
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            if cols[3] == "01" and cols[9] in inodes:  # ESTABLISHED
                pairs.append((addr(cols[1]), addr(cols[2])))
    return pairs


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1])
dist.all_reduce(total)
iface = os.environ.get("GLOO_SOCKET_IFNAME", "-")
net = ipaddress.ip_network(os.environ["EXPECT_NET"])
store_port = int(os.environ["MASTER_PORT"])
pairs = [(l, r) for l, r in own_tcp() if store_port not in (l[1], r[1])]
off = [l for l, _ in pairs if ipaddress.ip_address(l[0]) not in net]
if total.item() != world * (world + 1) // 2 or not pairs or off:
    print(f"FAIL gloo-fabric: {os.uname().nodename} rank {rank}: sum {total.item()}, "
          f"GLOO_SOCKET_IFNAME={iface}, gloo's connections {pairs}, off {net}: {off}", flush=True)
    sys.exit(3)
names = [None] * world
dist.all_gather_object(names, f"{os.uname().nodename}:{iface}:{pairs[0][0][0]}")
out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(out, torch.tensor([rank]))
if rank == 0:
    print(f"gloo over {sorted(set(names))}", flush=True)
report("gloo-fabric", rank, world, [t.item() for t in out])
dist.destroy_process_group()
