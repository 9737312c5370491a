"""The fact probe's shared reads against real systemd (issue #31): the Services facts read
every unit with one ``systemctl show``, and each unit's value must be what ``systemctl
is-active`` and ``is-enabled`` print for it, on a real node, for every kind of unit state.
(The unit tests can only give systemctl's answers as we know them: tests/unit/
test_shared_reads.py.)"""

from __future__ import annotations

import shlex

import pytest

from gpuk8s.facts.probe import build_probe, parse_probe
from gpuk8s.facts.system import Services
from tests.lab.lab import Lab

pytestmark = pytest.mark.lab

#: units of every kind on a Debian 12 lab node: running and enabled (ssh), its alias
#: (sshd), static (journald), a timer, not there at all, and the three made below
UNITS = ("ssh", "sshd", "systemd-journald", "sshd.service", "apt-daily.timer",
         "gpuk8s-lab-nosuch", "gpuk8s-lab-masked", "gpuk8s-lab-sysv", "gpuk8s-lab-disabled")
#: a masked unit, a SysV script with no unit of its own, a unit that is installed and off
SETUP = """ln -sf /dev/null /etc/systemd/system/gpuk8s-lab-masked.service
printf '#!/bin/sh\\n### BEGIN INIT INFO\\n# Provides: gpuk8s-lab-sysv\\n# Default-Start: 2 3 4 5\\n\
# Default-Stop: 0 1 6\\n### END INIT INFO\\nexit 0\\n' >/etc/init.d/gpuk8s-lab-sysv
chmod 755 /etc/init.d/gpuk8s-lab-sysv
printf '[Service]\\nExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n' \
  >/etc/systemd/system/gpuk8s-lab-disabled.service
systemctl daemon-reload"""
CLEANUP = """rm -f /etc/systemd/system/gpuk8s-lab-masked.service /etc/init.d/gpuk8s-lab-sysv \
  /etc/systemd/system/gpuk8s-lab-disabled.service
systemctl daemon-reload"""


def test_services_read_with_show_as_is_active_and_is_enabled_print(lab: Lab) -> None:
    node = "cpu-01"
    rc, out, err = lab.ssh(node, SETUP)
    assert rc == 0, err
    try:
        each = {}
        for unit in UNITS:
            q = shlex.quote(unit)
            rc, out, _ = lab.ssh(node, f"systemctl is-active {q} | head -n1; echo =; "
                                       f"systemctl is-enabled {q} 2>/dev/null | head -n1")
            active, _, enabled = out.partition("=\n")
            each[unit] = (active.strip() or "unknown", enabled.strip() or "unknown")
        facts = [Services(*UNITS[:4]), Services(*UNITS[3:])]
        script, marker = build_probe(facts)
        rc, out, err = lab.ssh(node, "sh -s", input=script)
        assert rc == 0, err
        probed = parse_probe(node, out, facts, marker)
        got = {u: (s.active, s.enabled) for f in facts for u, s in probed[f].items()}
        assert got == each
        # the kinds of state made here are there (sshd is an alias where ssh is enabled)
        assert each["gpuk8s-lab-masked"][1] == "masked"
        assert each["gpuk8s-lab-nosuch"] == ("inactive", "unknown")
        assert each["gpuk8s-lab-disabled"][1] == "disabled"
        assert each["systemd-journald"][1] == "static"
    finally:
        lab.ssh(node, CLEANUP)
