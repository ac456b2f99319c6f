"""Judge perftest output (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``*_lat``): the result
row when there is one, else perftest's own error lines, quoted, with advice for their cause."""

from __future__ import annotations

import re

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement, digits

# (substring of perftest's error line, advice); first match wins per line
_ERRORS: tuple[tuple[str, str], ...] = (
    ("Did not detect devices", "perftest sees no RDMA device: load the driver (mlx5_ib, irdma), "
     "check `ibv_devices`, and in a container pass /dev/infiniband"),
    ("state is Down", "the RDMA port is down: check `ibstat`/`ibv_devinfo` (cable, switch, SM)"),
    ("Couldn't get context for the device",
     "the device cannot be opened: check the name (-d), the driver, and /dev/infiniband in containers"),
    ("Couldn't connect to", "no perftest server answered: start the server side first, check the "
     "address and that TCP port 18515 (-p) is open"),
    ("Failed to modify QP", "the QP could not reach RTR/RTS: check the GID index (-x, a RoCE v2 "
     "IPv4 index from show_gids), the MTU and the route between the two NICs"),
    ("Unable to Connect the HCA", "the two NICs cannot connect: GID index, MTU, routing/VLAN"),
    ("Unable to create QP", "the device or provider does not support this QP/connection type "
     "(e.g. EFA needs -c SRD or UD with its provider); check the provider libraries"),
    ("Couldn't create IB resources", "resource creation failed: provider support, or the "
     "locked-memory limit (`ulimit -l unlimited`)"),
    ("RDMA CM event error", "rdma_cm could not connect: the server rejected or is unreachable; "
     "use the peer's RDMA interface IP with -R"),
    ("RDMA_CM_EVENT_REJECTED", "the peer rejected the rdma_cm connection (too many QPs, or no "
     "server on that port)"),
    ("ethernet_read_keys", "the out-of-band TCP exchange with the peer failed: the other side "
     "exited (see its own error) or the connection broke"),
    ("Failed to exchange data", "the out-of-band exchange failed: see the other side's error"),
    ("Completion with error", "a work request completed with an error: usually the peer's QP "
     "went away or the GID/MTU do not match; read the status code"),
    ("Couldn't allocate MR", "memory registration failed: raise `ulimit -l` to unlimited "
     "(containers: --ulimit memlock=-1)"),
    ("Couldn't set the link layer", "the port's link layer could not be read: the port is down"),
)
_UNIT = {"Gb/sec": 1.0, "MB/sec": 8e6 / 1e9, "MiB/sec": 8 * 1048576 / 1e9}


# the test banner perftest prints ("RDMA_Write Post List BW Test", "Send Lat Test") -> the program
_BANNER = re.compile(r"\b(RDMA_Write|RDMA_Read|Send|Atomic)\b[\w ]*? (BW|Lat(?:ency)?) Test\b")
_OPS = {"RDMA_Write": "write", "RDMA_Read": "read", "Send": "send", "Atomic": "atomic"}


def program(text: str, commands: tuple[str, ...] = ()) -> str:
    """ib_write_bw, ib_send_lat ... from the command line or the test banner; 'perftest' if neither says."""
    for c in commands:
        base = c.rsplit("/", 1)[-1]
        if re.fullmatch(r"ib_\w+_(?:bw|lat)", base):
            return base
    b = _BANNER.search(text)
    if b:
        return f"ib_{_OPS[b.group(1)]}_{'bw' if b.group(2) == 'BW' else 'lat'}"
    m = re.search(r"\b(ib_\w+_(?:bw|lat))\b", text)
    return m.group(1) if m else "perftest"


def judge_perftest(text: str, commands: tuple[str, ...] = ()) -> Judgement:
    j = Judgement(program(text, commands), family="perftest")
    facts = j.facts
    unit = None
    rows: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        for key, pat in (("test", r"^([\w_]+ (?:BW|Lat(?:ency)?) Test|[\w ]+ BW Test)$"),
                         ("device", r"Device\s*:\s*(\S+)"), ("link_type", r"Link type\s*:\s*(\S+)"),
                         ("mtu", r"^Mtu\s*:\s*(\d+)"), ("gid_index", r"GID index\s*:\s*(\d+)")):
            m = re.search(pat, line)
            if m and key not in facts:
                facts[key] = m.group(1)
        m = re.search(r"BW average\[(Gb/sec|MB/sec|MiB/sec)\]", line)
        if m:
            unit = m.group(1)
            continue
        parts = line.split()
        if unit and len(parts) >= 4 and digits(parts[0]) and digits(parts[1]):
            rows.append(parts)
    errors = []
    for raw in text.splitlines():
        line = raw.strip()
        for needle, advice in _ERRORS:
            if needle in line:
                errors.append((line, advice))
                break
    if rows and unit:
        last = rows[-1]
        try:
            avg = float(last[3]) * _UNIT[unit]
            facts.update(size_bytes=int(last[0]), avg_gbps=round(avg, 4),
                         peak_gbps=round(float(last[2]) * _UNIT[unit], 4), rows=len(rows))
        except (ValueError, IndexError):
            j.add(WARN, f"result row not readable: {' '.join(last)}", "save the output again")
    seen = set()
    for line, advice in errors:
        if advice not in seen:
            seen.add(advice)
            j.add(FAIL, f"perftest says: {line}", advice)
    if "avg_gbps" in facts:
        j.add(PASS, f"measured {facts['avg_gbps']:g} Gb/s average at {facts['size_bytes']} B "
                    f"messages ({facts.get('link_type', '?')})")
    elif not errors:
        j.add(WARN, "perftest started but the text has no result row",
              "the run was cut or is still waiting for its peer: run both sides to the end "
              "(server first, then client with the server's address)")
    return j
